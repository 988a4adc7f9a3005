# -*- test-case-name: iop.test.edge.ingress.test_record_model -*-
"""
A request counts under the model it named as soon as it named a configured one: refused by its
key's scope, or a direct route with no node to run on, it is still that model's request in the
metrics and the console; a name the Edge does not have stays out of the labels ("").
"""

from __future__ import annotations

from iop.edge.events import RequestFinished
from iop.test.edge.ingress.harness import LIMITED_KEY, Ingress, IngressCase


class RecordModelTests(IngressCase):
    def chat(self, model: str, key: str | None = None) -> RequestFinished:
        ingress: Ingress = self.edge
        before = len(ingress.records)
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if key is None:
            d = ingress.post("/v1/chat/completions", body)
        else:
            d = ingress.post("/v1/chat/completions", body, key=key)
        status, _, _ = self.answer(d)
        self.assertGreaterEqual(status, 400)
        [record] = ingress.records[before:]
        return record

    def test_refused_by_the_key_scope(self) -> None:
        record = self.chat("native", key=LIMITED_KEY)
        self.assertEqual((record.status, record.model, record.outcome), (403, "native", "refused"))
        self.assertEqual(record.provider_id, "")

    def test_direct_route_without_its_node(self) -> None:
        self.edge.registry.disconnected(self.edge.conn)
        record = self.chat("cli")
        self.assertEqual((record.status, record.model), (503, "cli"))
        self.assertEqual(record.error_code, "node_unavailable")

    def test_unknown_model_is_not_a_label(self) -> None:
        record = self.chat("made-up-model")
        self.assertEqual((record.status, record.model), (404, ""))
