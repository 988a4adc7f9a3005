"""
Tests for :mod:`iop.node.admission`: the admission object the run and tunnel managers hold,
driven directly (the managers' own tests drive it through runs and tunnels).
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from iop.node.adapters.capacity import Slot
from iop.node.adapters.registry import AdapterInstance
from iop.node.admission import CONNECTION_LOST_REASON, Admission, Admitted, Nouns, Refusal
from iop.runtime.codes import ErrorCode
from iop.test.node.fakes import capture_events
from iop.test.node.test_runs import ScriptedProvider, registry_of
from iop.wire import runtime_pb2 as pb

NOUNS = Nouns(work="job", request="job request", active="job")


@dataclass(eq=False)
class Job:
    run_id: str
    adapter: str
    slot: Slot


class AdmissionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent: list[pb.Envelope] = []
        self.registry = registry_of(
            ScriptedProvider("gpu", max_concurrency=1),
            ScriptedProvider("cpu"),
            ScriptedProvider("off"),
            disabled=["off"],
        )
        self.admission: Admission[Job] = Admission(
            self.registry, self.sent.append, NOUNS, node_id="node-1"
        )
        self.checked: list[str] = []
        self.refused: list[tuple[str, Refusal]] = []
        self.logged = capture_events(self)

    def check(self, request: pb.RunRequest, instance: AdapterInstance) -> str:
        self.checked.append(instance.name)
        if request.target == "no":
            raise Refusal("the kind says no", adapter=instance.name)
        return f"plan for {request.target}"

    def refuse(self, request: pb.RunRequest, refusal: Refusal) -> None:
        self.refused.append((request.run_id, refusal))

    def admit(self, run_id: str = "r1", adapter: str = "gpu", target: str = "t") -> Job | None:
        """Admit one request and, when admitted, enter it as a job (as a manager does)."""
        admitted = self.admission.admit(
            pb.RunRequest(run_id=run_id, adapter=adapter, target=target), self.check, self.refuse
        )
        if admitted is None:
            return None
        job = Job(run_id, admitted.instance.name, admitted.slot)
        self.admission.enter(job)
        return job

    def refusal(self) -> Refusal:
        [(_, refusal)] = self.refused
        return refusal

    def test_admitted_holds_the_slot_and_the_plan(self) -> None:
        admitted = self.admission.admit(
            pb.RunRequest(run_id="r1", adapter="gpu", target="t"), self.check, self.refuse
        )
        assert admitted is not None
        self.assertIsInstance(admitted, Admitted)
        self.assertEqual(admitted.plan, "plan for t")
        self.assertEqual(admitted.instance.name, "gpu")
        self.assertFalse(admitted.slot.released)
        self.assertEqual(self.registry.get("gpu").gate.in_use, 1)
        # Admitting is not entering: the caller builds its item and enters it.
        self.assertFalse(self.admission.is_active("r1"))
        self.assertEqual(self.refused, [])
        self.assertEqual(self.sent, [])

    def test_active_table(self) -> None:
        first = self.admit("r1", "gpu")
        second = self.admit("r2", "cpu")
        assert first is not None and second is not None
        self.assertTrue(self.admission.is_active("r1"))
        self.assertIn("r2", self.admission)
        self.assertIs(self.admission.get("r1"), first)
        self.assertIsNone(self.admission.get("nope"))
        self.assertEqual(list(self.admission), [first, second])
        self.assertEqual(self.admission.active_count(), 2)
        self.assertEqual(self.admission.active_count("cpu"), 1)
        self.assertEqual(self.admission.active_count("off"), 0)
        # Only the item under its run id leaves: a stale one is not taken for it.
        self.admission.leave(Job("r1", "gpu", first.slot))
        self.assertTrue(self.admission.is_active("r1"))
        self.admission.leave(first)
        self.admission.leave(first)
        self.assertFalse(self.admission.is_active("r1"))
        self.assertEqual(self.admission.active_count(), 1)

    def test_refusals_in_order(self) -> None:
        """Each shared check refuses with its reason; the kind's check runs on an enabled
        instance only, before the gate."""
        self.assertIsNotNone(self.admit("r1", "gpu"))
        cases = [
            ("", "gpu", "t", "job request without a run_id", None, False),
            ("r1", "cpu", "t", "job 'r1' is already active on this node", None, False),
            ("r2", "nope", "t", "unknown adapter", None, True),
            ("r3", "off", "t", "adapter 'off' is disabled", None, True),
            ("r4", "cpu", "no", "the kind says no", None, True),
            ("r5", "gpu", "t", "adapter 'gpu' is at capacity (1/1)", "provider_at_capacity", True),
        ]
        for run_id, adapter, target, reason, code, record in cases:
            self.refused.clear()
            self.checked.clear()
            self.assertIsNone(self.admit(run_id, adapter, target))
            refusal = self.refusal()
            self.assertIn(reason, refusal.reason)
            self.assertEqual(refusal.code.value if refusal.code else None, code)
            self.assertEqual(refusal.metadata, {"error_code": code} if code else {})
            self.assertEqual(refusal.record, record)
            self.assertEqual(self.checked, [adapter] if target == "no" or code else [])
        # Nothing refused took a slot or entered the table; nothing was sent by admission.
        self.assertEqual(self.registry.get("gpu").gate.in_use, 1)
        self.assertEqual(self.registry.get("cpu").gate.in_use, 0)
        self.assertEqual(self.admission.active_count(), 1)
        self.assertEqual(self.sent, [])
        [logged] = [
            e for e in self.logged if "at capacity" in formatEvent(e) and e.get("error_code")
        ]
        self.assertEqual(
            formatEvent(logged),
            "refusing job r5 for adapter gpu: adapter 'gpu' is at capacity (1/1)",
        )
        self.assertEqual(logged["error_code"], ErrorCode.PROVIDER_AT_CAPACITY.value)

    def test_close(self) -> None:
        first = self.admit("r1", "gpu")
        second = self.admit("r2", "cpu")
        self.checked.clear()
        self.assertFalse(self.admission.closed)
        self.assertEqual(self.admission.close(), [first, second])
        self.assertTrue(self.admission.closed)
        # The items leave as their owner ends them.
        self.assertEqual(self.admission.active_count(), 2)
        # Later requests are ignored (not refused: nothing can be sent), nothing is sent.
        self.assertIsNone(self.admit("r3", "cpu"))
        self.assertEqual(self.refused, [])
        self.assertEqual(self.checked, [])
        self.assertEqual(self.registry.get("cpu").gate.in_use, 1)
        self.admission.send(pb.Envelope(heartbeat=pb.Heartbeat()), "r1")
        self.assertEqual(self.sent, [])
        self.assertTrue(
            any(
                formatEvent(e) == "ignoring job r3: the edge connection is gone"
                for e in self.logged
            )
        )
        self.assertEqual(CONNECTION_LOST_REASON, "edge connection lost")

    def test_send_failure_is_logged_not_raised(self) -> None:
        def broken(envelope: pb.Envelope) -> None:
            raise RuntimeError("transport gone")

        admission: Admission[Job] = Admission(self.registry, broken, NOUNS)
        admission.send(pb.Envelope(heartbeat=pb.Heartbeat()), "r1")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        envelope = pb.Envelope(heartbeat=pb.Heartbeat())
        self.admission.send(envelope, "r1")
        self.assertEqual(self.sent, [envelope])
