"""The event bus: observers only, isolated from the publisher and from each other."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from iop.edge.events import EventBus, NodeEvent, NodeEventKind


def event(node_id: str = "n") -> NodeEvent:
    return NodeEvent(NodeEventKind.CONNECTED, node_id)


class EventBusTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.bus = EventBus(self.clock, max_pending=3)

    def test_delivery_is_deferred_to_a_later_turn(self) -> None:
        seen: list[NodeEvent] = []
        self.bus.subscribe(seen.append)
        self.bus.publish(event())
        self.assertEqual(seen, [])
        self.clock.advance(0)
        self.assertEqual(seen, [event()])

    def test_failing_subscriber_isolated(self) -> None:
        seen: list[NodeEvent] = []

        def broken(e: NodeEvent) -> None:
            raise RuntimeError("observer bug")

        self.bus.subscribe(broken)
        self.bus.subscribe(seen.append)
        self.bus.publish(event("a"))
        self.bus.publish(event("b"))
        self.clock.advance(0)
        self.assertEqual([e.node_id for e in seen], ["a", "b"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)

    def test_slow_subscriber_drops_beyond_bound(self) -> None:
        seen: list[NodeEvent] = []
        self.bus.subscribe(seen.append)
        for i in range(5):
            self.bus.publish(event(str(i)))
        self.clock.advance(0)
        self.assertEqual([e.node_id for e in seen], ["0", "1", "2"])
        self.assertEqual(self.bus.dropped(), 2)

    def test_unsubscribe(self) -> None:
        seen: list[NodeEvent] = []
        unsubscribe = self.bus.subscribe(seen.append)
        self.bus.publish(event())
        unsubscribe()
        self.clock.advance(0)
        self.assertEqual(seen, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])
