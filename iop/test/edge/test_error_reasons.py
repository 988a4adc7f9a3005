# -*- test-case-name: iop.test.edge.test_error_reasons -*-
"""
Why requests fail, per model and provider, where an operator looks: ``/metrics`` counts a
request that named no configured model under ``model="(none)"`` (never an empty label) and its
errors by model, provider, node and code (``iop_request_errors_total``); the console remembers
the last error of each model and provider.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.edge.console.memory import ConsoleMemory
from iop.edge.console.payload import console_event, error_reason
from iop.edge.events import NO_MODEL, RequestFinished
from iop.edge.metrics import EdgeMetrics
from iop.test.edge.test_metrics import finished, parse


def refused(model: str = "", status: int = 401, code: str = "invalid_api_key") -> RequestFinished:
    return finished(
        model=model, provider="", node="", status=status, outcome="refused", error_code=code
    )


class MetricsLabelTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.metrics = EdgeMetrics(lambda: {"providers": [], "nodes": []})

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return parse(self.metrics.render().decode())[1]

    def test_no_empty_model_label(self) -> None:
        self.metrics.observe(refused())
        self.metrics.observe(refused("pool", 403, "model_not_allowed"))
        samples = self.samples()
        models = {
            dict(labels)["model"]
            for (name, labels), value in samples.items()
            if name == "iop_requests_total"
        }
        self.assertEqual(models, {NO_MODEL, "pool"})
        self.assertEqual(NO_MODEL, "(none)")

    def test_errors_by_model_provider_and_code(self) -> None:
        self.metrics.observe(finished(status=503, outcome="error", error_code="provider_busy"))
        self.metrics.observe(finished(status=503, outcome="error", error_code="provider_busy"))
        self.metrics.observe(refused())
        self.metrics.observe(finished())  # a success is not an error
        samples = self.samples()
        errors = {
            tuple(sorted(dict(labels).items())): value
            for (name, labels), value in samples.items()
            if name == "iop_request_errors_total"
        }
        self.assertEqual(
            errors,
            {
                (
                    ("code", "provider_busy"),
                    ("model", "pool"),
                    ("node", "node-a"),
                    ("provider", "a-chat"),
                ): 2.0,
                (
                    ("code", "invalid_api_key"),
                    ("model", NO_MODEL),
                    ("node", ""),
                    ("provider", ""),
                ): 1.0,
            },
        )


class ConsoleReasonTests(SynchronousTestCase):
    def test_payload_names_the_bucket(self) -> None:
        shown = console_event(refused())
        assert shown is not None
        self.assertEqual(shown[1]["model"], NO_MODEL)

    def test_last_errors(self) -> None:
        memory = ConsoleMemory()
        for event in (
            finished(status=502, outcome="error", error_code="upstream_error", at=1.0),
            finished(status=503, outcome="error", error_code="provider_busy", at=2.0),
            finished(at=3.0),  # later successes do not hide the last error
            refused(),
            finished(model="other", provider="b-chat", status=0, outcome="cancelled", at=5.0),
        ):
            memory.observe(event)
        last: dict[str, Any] = memory.snapshot()["last_errors"]
        self.assertEqual(
            last["models"]["pool"],
            {
                "at": 2.0,
                "status": 503,
                "code": "provider_busy",
                "model": "pool",
                "provider_id": "a-chat",
                "node_id": "node-a",
            },
        )
        self.assertEqual(last["providers"]["a-chat"]["code"], "provider_busy")
        self.assertEqual(last["models"][NO_MODEL]["code"], "invalid_api_key")
        # A cancelled request is not an error: the client left.
        self.assertNotIn("other", last["models"])
        self.assertEqual(set(last["providers"]), {"a-chat"})


class ReasonTextTests(SynchronousTestCase):
    def test_code_without_an_error_code(self) -> None:
        """A provider's own error answer, relayed, has no IOP code: ``upstream``; an ended
        request without a code says how it ended."""
        self.assertEqual(error_reason({"status": 500, "outcome": "complete"})["code"], "upstream")
        self.assertEqual(error_reason({"status": 502, "outcome": "error"})["code"], "error")
        self.assertEqual(
            error_reason({"status": 503, "outcome": "refused", "error_code": "queue_timeout"})[
                "code"
            ],
            "queue_timeout",
        )
