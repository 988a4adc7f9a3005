# -*- test-case-name: iop.test.node.test_tunnel -*-
"""
A provider tunnel's header policy, both ways: which of the Edge's request headers reach the
provider, and which of the provider's response headers go back.

Credentials are the adapter's: its configured headers are sent upstream and appear nowhere else
(not in frames, errors or logs); a request's own headers pass only through an allow-list
(:data:`FORWARDED_REQUEST_HEADERS`) and can never replace a configured header or carry
credentials of their own (:data:`CREDENTIAL_HEADERS`). Hop-by-hop and framing headers of the
response are not passed back; in managed mode the lease's secret is removed from the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from twisted.web.http_headers import Headers

from iop.security.echo import EchoRedactor
from iop.wire import runtime_pb2 as pb

__all__ = [
    "CREDENTIAL_HEADERS",
    "FORWARDED_REQUEST_HEADERS",
    "HOP_BY_HOP_HEADERS",
    "clean",
    "filter_response_headers",
    "logged_header_names",
    "upstream_request_headers",
]

# At most this many dropped request header names are logged per tunnel.
LOGGED_HEADER_NAMES = 16

# Request headers of the Edge's request that may reach the provider. Everything else is dropped.
FORWARDED_REQUEST_HEADERS = frozenset(
    {
        "content-type",
        "accept",
        "user-agent",
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "x-request-id",
        "idempotency-key",
    }
)
# Never taken from the request, whatever the allow-list says: credentials are the adapter's.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
)
# Response headers that describe one hop (or the body's framing) and are not passed back.
HOP_BY_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


def clean(value: str) -> bool:
    """No CR, LF or NUL in ``value`` (a header value, or a path that goes in a request line)."""
    return "\r" not in value and "\n" not in value and "\0" not in value


def upstream_request_headers(
    configured: Mapping[str, str],
    requested: Iterable[pb.Header],
    auth_header: str = "",
    has_body: bool = True,
) -> tuple[Headers, list[str]]:
    """
    The headers of the provider request: the adapter's ``configured`` headers (credentials),
    plus those of ``requested`` whose names are on :data:`FORWARDED_REQUEST_HEADERS` and are not
    configured, not the profile's ``auth_header`` and not a credential header. A body without a
    content type is sent as ``application/json``. Also returns the names of the dropped request
    headers (for a debug log: names only, never values).
    """
    blocked = {name.strip().lower() for name in configured} | CREDENTIAL_HEADERS
    if auth_header:
        blocked.add(auth_header.strip().lower())
    out: dict[str, list[str]] = {}
    dropped: list[str] = []
    for header in requested:
        name = header.name.strip().lower()
        if name in FORWARDED_REQUEST_HEADERS and name not in blocked and clean(header.value):
            out.setdefault(name, []).append(header.value)
        else:
            dropped.append(name)
    if has_body and "content-type" not in out and "content-type" not in blocked:
        out["content-type"] = ["application/json"]
    for name, value in configured.items():
        out[name] = [value]
    return Headers(out), dropped


def filter_response_headers(
    headers: Headers,
    redact: Callable[[str], str] = lambda text: text,
    echo: EchoRedactor | None = None,
) -> list[tuple[str, str]]:
    """
    The provider's response headers to pass back: without hop-by-hop and length headers (and
    any named by ``Connection``), each value through ``redact``. With ``echo`` (managed mode:
    the lease's secret), a header whose name holds the secret is dropped and every value has
    it replaced, each counted by ``echo``.
    """
    named = {
        token.strip().lower()
        for value in headers.getRawHeaders(b"connection", [])
        for token in value.decode("latin-1").split(",")
    }
    out: list[tuple[str, str]] = []
    for raw_name, values in headers.getAllRawHeaders():
        name = raw_name.decode("latin-1")
        lowered = name.lower()
        if lowered in HOP_BY_HOP_HEADERS or lowered in named:
            continue
        if echo is not None and echo.contains(raw_name):
            # A name cannot carry the marker (no brackets in a header name): the header goes.
            echo.note(len(values))
            continue
        for value in values:
            if echo is not None:
                value = echo.redact(value)
            out.append((name, redact(value.decode("latin-1"))))
    return out


def logged_header_names(dropped: Iterable[str]) -> list[str]:
    """
    The dropped request header names for the tunnel's log line: names the Edge sent (a
    client's, really), so a bounded number (:data:`LOGGED_HEADER_NAMES`), each clipped.
    """
    names = sorted(set(dropped))
    return [name[:64] for name in names[:LOGGED_HEADER_NAMES]]
