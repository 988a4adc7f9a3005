from twisted.trial.unittest import SynchronousTestCase

from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import event_from_proto, event_to_proto, usage_from_proto, usage_to_proto


class ConvertTests(SynchronousTestCase):
    def test_usage_round_trip_keeps_unreported_as_none(self) -> None:
        for usage in (Usage(1, 2), Usage(1, 2, 3, 4), Usage(0, 0, 0, None)):
            self.assertEqual(usage_from_proto(usage_to_proto(usage)), usage)

    def test_event_round_trip(self) -> None:
        event = RuntimeEvent.complete(Usage(3, 4, 1), {"finish_reason": "stop"}, session_id="s")
        message = event_to_proto(event, "run-1", 7, 1234)
        self.assertEqual(
            (message.run_id, message.sequence, message.timestamp_unix_ms), ("run-1", 7, 1234)
        )
        self.assertEqual(event_from_proto(message), event)

    def test_unknown_type_is_an_error(self) -> None:
        event = event_from_proto(pb.RunEvent(run_id="r", sequence=1, type="teleport"))
        self.assertEqual(event.type, EventType.ERROR)
        self.assertIn("teleport", event.error)
