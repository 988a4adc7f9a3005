# -*- test-case-name: iop.test.logs.test_limiter -*-
"""
A log line per event, until events come in a flood: :class:`LogLimiter` decides, on the clock,
which events still get their own line.

At most one line per key (say, a peer address and what went wrong) per ``interval`` seconds,
and at most ``burst`` lines in any ``interval`` whatever their keys. What it holds back it
tallies by category and hands to its ``summary`` callable once, ``interval`` seconds after the
first event it held back: one line then says how many more there were. Counting every event is
the caller's business (a metric); this only keeps the log readable.

Clock-driven and without I/O of its own; its memory is bounded by ``burst`` (the keys of the
lines it let through recently), however many events or keys arrive.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable

from twisted.internet.interfaces import IDelayedCall, IReactorTime

#: summary(count, by_category, since): ``count`` events held back since ``since`` (clock
#: seconds), ``by_category`` how many of each category.
Summary = Callable[[int, dict[str, int], float], None]


class LogLimiter:
    """Which events get a log line of their own; the rest summed up once per interval."""

    def __init__(
        self, clock: IReactorTime, summary: Summary, interval: float = 60.0, burst: int = 10
    ) -> None:
        if interval <= 0 or burst < 1:
            raise ValueError("LogLimiter: interval must be > 0 and burst at least 1")
        self._clock = clock
        self._summary = summary
        self.interval = interval
        self.burst = burst
        # When each key last had a line (only keys within the last interval matter).
        self._last: dict[Hashable, float] = {}
        self._forget_at = 0.0
        # When the last `burst` lines were let through.
        self._recent: deque[float] = deque(maxlen=burst)
        self._held: dict[str, int] = {}
        self._held_since: float | None = None
        self._timer: IDelayedCall | None = None

    def admit(self, key: Hashable, category: str) -> bool:
        """
        Whether this event gets its own line now. When not, it is tallied under ``category``
        for the next summary.
        """
        now = self._clock.seconds()
        self._forget(now)
        last = self._last.get(key)
        recent_full = len(self._recent) == self.burst and now - self._recent[0] < self.interval
        if (last is not None and now - last < self.interval) or recent_full:
            self._hold(now, category)
            return False
        self._last[key] = now
        self._recent.append(now)
        return True

    def pending(self) -> int:
        """How many events are held back for the next summary."""
        return sum(self._held.values())

    def flush(self) -> None:
        """Hand what is held back to the summary now (say, when stopping)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._summarise()

    def _forget(self, now: float) -> None:
        # At most once per interval, and then over at most about twice burst keys.
        if now < self._forget_at:
            return
        self._forget_at = now + self.interval
        self._last = {k: t for k, t in self._last.items() if now - t < self.interval}

    def _hold(self, now: float, category: str) -> None:
        self._held[category] = self._held.get(category, 0) + 1
        if self._held_since is None:
            self._held_since = now
            self._timer = self._clock.callLater(self.interval, self._summarise)

    def _summarise(self) -> None:
        self._timer = None
        held, since = self._held, self._held_since
        self._held, self._held_since = {}, None
        if since is not None and held:
            self._summary(sum(held.values()), held, since)
