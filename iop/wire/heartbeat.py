# -*- test-case-name: iop.test.wire.test_heartbeat -*-
"""
Liveness for one node socket, used identically by both ends.

Every ``interval`` seconds the owner sends a heartbeat; every frame received from the peer counts
as proof of life. When nothing has arrived for ``timeout`` seconds the peer is declared dead
(``on_timeout``): the fallback for power loss and network cuts, where no FIN ever arrives.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime


class Heartbeat:
    def __init__(
        self,
        clock: IReactorTime,
        interval: float,
        timeout: float,
        send: Callable[[int], None],
        on_timeout: Callable[[], None],
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError("heartbeat interval and timeout must be positive")
        self._clock = clock
        self._interval = interval
        self._timeout = timeout
        self._send = send
        self._on_timeout = on_timeout
        self._sequence = 0
        self._tick: IDelayedCall | None = None
        self._deadline: IDelayedCall | None = None
        # When the peer last sent anything: the deadline looks at it when it fires (a frame
        # costs one clock read, not a timer reset).
        self._last_heard = 0.0

    @property
    def running(self) -> bool:
        return self._deadline is not None

    def start(self) -> None:
        """Begin sending and watching. Idempotent."""
        if self._deadline is not None:
            return
        self._last_heard = self._clock.seconds()
        self._deadline = self._clock.callLater(self._timeout, self._check)
        self._tick = self._clock.callLater(self._interval, self._beat)

    def received(self) -> None:
        """The peer sent something: the deadline moves out to ``timeout`` from now."""
        self._last_heard = self._clock.seconds()

    def stop(self) -> None:
        """Stop sending and watching. Idempotent."""
        for call in (self._tick, self._deadline):
            if call is not None and call.active():
                call.cancel()
        self._tick = self._deadline = None

    def _beat(self) -> None:
        self._sequence += 1
        self._tick = self._clock.callLater(self._interval, self._beat)
        self._send(self._sequence)

    def _check(self) -> None:
        left = self._last_heard + self._timeout - self._clock.seconds()
        if left > 0:
            self._deadline = self._clock.callLater(left, self._check)
            return
        self.stop()
        self._on_timeout()
