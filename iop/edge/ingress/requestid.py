# -*- test-case-name: iop.test.edge.ingress.test_requestid -*-
"""
Each client request's id on the client listener: assigned once, before anything answers, and
set on the answer whatever answers it.

:class:`RequestIdResource` stands outermost in front of the app (CORS preflights, the router's
own 404/405, the fast path, every error): :func:`stamp` takes the client's ``x-request-id`` or
makes a new one (the rule and the form: :mod:`iop.runtime.requestid`), keeps it on the request
(:func:`request_id_of`) and sets ``x-request-id`` on the response — and Anthropic's
``request-id`` too on the Anthropic surface, which is where its SDK reads ``_request_id`` —
before any handler runs, so a JSON answer, an error and a stream's head all carry it. The
listener's own refusals, which never reach a resource, apply the same rule to the header
lines they saw (:class:`~iop.edge.ingress.channel.ClientChannel`).

Everything else reads the id from the request: the record (its access log line and ledger
row, :mod:`.record`), error bodies (:func:`~.http.render_error`), the run or tunnel sent to a
node (:class:`~.relay.Work`: the request metadata).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource

from iop.edge.ingress.errors import ANTHROPIC
from iop.runtime.requestid import ANTHROPIC_HEADER, HEADER, accepted

__all__ = ["RequestIdResource", "request_id_of", "response_headers", "stamp"]

# Where the id rides on its request.
_ATTRIBUTE = "_iop_request_id"
_HEADER = HEADER.encode("ascii")


def response_headers(request_id: str, surface: str) -> list[tuple[str, str]]:
    """The headers that carry ``request_id`` on an answer of ``surface``."""
    headers = [(HEADER, request_id)]
    if surface == ANTHROPIC:
        headers.append((ANTHROPIC_HEADER, request_id))
    return headers


def stamp(request: IRequest, surface: str, clock: IReactorTime) -> str:
    """``request``'s id, assigned now if it has none, and set on its response's headers."""
    request_id = request_id_of(request)
    if not request_id:
        request_id = accepted(request.requestHeaders.getRawHeaders(_HEADER), clock.seconds())
        setattr(request, _ATTRIBUTE, request_id)
    for name, value in response_headers(request_id, surface):
        request.setHeader(name.encode("ascii"), value.encode("ascii"))
    return request_id


def request_id_of(request: IRequest) -> str:
    """The id :func:`stamp` gave ``request`` ("" when it was not stamped)."""
    value = getattr(request, _ATTRIBUTE, "")
    return value if isinstance(value, str) else ""


class RequestIdResource(Resource):
    """The app's resource behind :func:`stamp` (module docstring); ``surface_of`` says which
    surface a request is on."""

    isLeaf = True

    def __init__(
        self, inner: IResource, surface_of: Callable[[IRequest], str], clock: IReactorTime
    ) -> None:
        super().__init__()
        self._inner = inner
        self._surface_of = surface_of
        self._clock = clock

    def render(self, request: IRequest) -> Any:
        stamp(request, self._surface_of(request), self._clock)
        return self._inner.render(request)
