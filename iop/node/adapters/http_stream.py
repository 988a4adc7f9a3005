# -*- test-case-name: iop.test.node.adapters.test_openai_compat,iop.test.node.test_tunnel -*-
"""
Reading an HTTP response body incrementally, in a way that can be cancelled for real.

treq's ``collect`` cannot stop a download: cancelling it leaves the connection open and the
upstream keeps generating. :class:`BodyReader` is the body protocol the HTTP adapters and the
provider tunnel share instead: it hands every chunk to a callback as it arrives, and cancelling
its ``finished`` Deferred stops the response's transport, so the connection closes and the
upstream sees the client go away.

Use it through :func:`read_body` (or :func:`read_limited`) inside a coroutine wrapped with
``Deferred.fromCoroutine``: cancelling that Deferred while it awaits the body cancels the reader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse

__all__ = ["BodyReader", "StopReading", "ended_cleanly", "read_body", "read_limited"]


class StopReading(Exception):
    """Raised by a body callback that has read enough: the reader stops and ends cleanly."""


class BodyReader(Protocol):
    """
    Hands each body chunk to ``on_data``. ``finished`` fires with why the body ended (an
    exception such as ``ResponseDone``), or fails with what ``on_data`` raised. Cancelling
    ``finished`` stops the transport (the connection closes, so the upstream sees the client go
    away) and ignores later bytes.
    """

    def __init__(self, on_data: Callable[[bytes], None]) -> None:
        self._on_data = on_data
        self._over = False
        self.finished: Deferred[BaseException] = Deferred(self._cancel)

    def dataReceived(self, data: bytes) -> None:
        if self._over:
            return
        try:
            self._on_data(data)
        except StopReading:
            self._stop()
            self.finished.callback(ResponseDone("stopped reading"))
        except BaseException:
            failure = Failure()
            self._stop()
            self.finished.errback(failure)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if not self._over:
            self._over = True
            # The reason's exception, not the Failure: a Failure result would be an errback.
            why = reason.value
            self.finished.callback(why if why is not None else ConnectionDone())

    def _stop(self) -> None:
        self._over = True
        if self.transport is not None:
            # A response body's transport is the connection's push producer.
            cast(IPushProducer, self.transport).stopProducing()

    def _cancel(self, _: Deferred[BaseException]) -> None:
        self._stop()


async def read_body(response: IResponse, on_data: Callable[[bytes], None]) -> BaseException:
    """Feed ``response``'s body to ``on_data``; return why it ended (see :func:`ended_cleanly`)."""
    reader = BodyReader(on_data)
    response.deliverBody(reader)
    return await reader.finished


async def read_limited(response: IResponse, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of a body, and whether there was more."""
    parts: list[bytes] = []
    size = 0
    truncated = False

    def collect(data: bytes) -> None:
        nonlocal size, truncated
        parts.append(data[: limit - size])
        size += len(parts[-1])
        if size >= limit:
            truncated = True
            raise StopReading()

    await read_body(response, collect)
    return b"".join(parts), truncated


def ended_cleanly(reason: BaseException) -> bool:
    """
    Whether a body ended because it was complete: ``ResponseDone``, or ``PotentialDataLoss`` (a
    body without a length, which ends when the server closes the connection).
    """
    return isinstance(reason, (ResponseDone, PotentialDataLoss))
