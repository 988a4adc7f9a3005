# -*- test-case-name: iop.test.edge.ingress.test_cors -*-
"""
CORS on the client listener (:mod:`iop.edge.ingress.cors`): preflights answered from raw bytes,
``Access-Control-*`` headers on answers, errors and streams, the connection's refusals, and
nothing of it when ``openai.cors`` is absent.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import CorsConfig
from iop.edge.ingress.cors import ALLOW_HEADERS, EXPOSE_HEADERS
from iop.test.edge.ingress.harness import (
    BODY_LIMIT,
    CHAT,
    END,
    KEY,
    IngressCase,
    body,
    start,
)
from iop.test.edge.ingress.wire import Connection, Response, Wire

SITE = "https://app.example.com"
OTHER = "https://evil.example.net"
CORS = CorsConfig(allow_origins=(SITE, "http://localhost:5173"), max_age_sec=300)
REQUIRED = {"authorization", "x-api-key", "anthropic-version", "anthropic-beta", "content-type"}


def preflight(
    path: str, origin: str | None = SITE, method: str | None = "POST", extra: str = ""
) -> bytes:
    lines = [f"OPTIONS {path} HTTP/1.1", "Host: edge"]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    if method is not None:
        lines.append(f"Access-Control-Request-Method: {method}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def names(value: str | None) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


class WireCase(SynchronousTestCase):
    cors: CorsConfig | None = CORS

    def setUp(self) -> None:
        self.wire = Wire(cors=self.cors)

    def send(self, data: bytes) -> Connection:
        connection = self.wire.connect()
        connection.send(data)
        return connection

    def only(self, data: bytes) -> Response:
        return self.send(data).only()


class PreflightTests(WireCase):
    def test_allowed_origin(self) -> None:
        response = self.only(
            preflight(
                "/v1/chat/completions",
                extra="Access-Control-Request-Headers: authorization, content-type, "
                "x-stainless-os, X-Stainless-Retry-Count\r\n",
            )
        )
        self.assertEqual(response.status, 204, response)
        self.assertEqual(response.header("access-control-allow-origin"), SITE)
        self.assertEqual(names(response.header("access-control-allow-methods")), ["POST"])
        allowed = set(names(response.header("access-control-allow-headers")))
        self.assertLessEqual(REQUIRED | set(ALLOW_HEADERS), allowed)
        # What the browser asked for besides (the SDKs' own headers), lowercased.
        self.assertLessEqual({"x-stainless-os", "x-stainless-retry-count"}, allowed)
        self.assertEqual(response.header("access-control-max-age"), "300")
        self.assertEqual(
            names(response.header("vary")), ["Origin", "Access-Control-Request-Headers"]
        )
        self.assertIsNone(response.header("access-control-allow-credentials"))
        self.assertEqual(response.body, b"")

    def test_needs_no_key_and_each_route_names_its_methods(self) -> None:
        for path, methods in (
            ("/v1/models", ["GET", "HEAD"]),
            ("/v1/models/chat", ["GET", "HEAD"]),
            ("/v1/messages", ["POST"]),
            ("/v1/messages/count_tokens", ["POST"]),
            ("/v1/responses", ["POST"]),
        ):
            response = self.only(preflight(path, origin="http://localhost:5173", method="GET"))
            self.assertEqual(response.status, 204, (path, response))
            self.assertEqual(
                sorted(names(response.header("access-control-allow-methods"))), methods, path
            )
            self.assertEqual(
                response.header("access-control-allow-origin"), "http://localhost:5173"
            )

    def test_origin_not_allowed(self) -> None:
        for origin in (OTHER, SITE + ":8443", SITE.upper(), "null"):
            response = self.only(preflight("/v1/chat/completions", origin=origin))
            self.assertEqual(response.status, 403, origin)
            self.assertEqual(response.json()["error"]["type"], "permission_error")
            self.assertIn("openai.cors.allow_origins", response.json()["error"]["message"])
            self.assertFalse(
                [h for h in response.headers if h.startswith("access-control-")], origin
            )
            self.assertEqual(response.header("vary"), "Origin")

    def test_refusal_in_the_anthropic_shape(self) -> None:
        response = self.only(preflight("/v1/messages", origin=OTHER))
        self.assertEqual(response.status, 403)
        self.assertEqual(response.json()["type"], "error")
        self.assertEqual(response.json()["error"]["type"], "permission_error")

    def test_no_route(self) -> None:
        response = self.only(preflight("/v1/nothing"))
        self.assertEqual(response.status, 404)
        self.assertIn("no route for OPTIONS /v1/nothing", response.json()["error"]["message"])

    def test_plain_options(self) -> None:
        for request in (
            preflight("/v1/chat/completions", origin=None, method=None),
            preflight("/v1/chat/completions", origin=SITE, method=None),
        ):
            response = self.only(request)
            self.assertEqual(response.status, 204)
            self.assertEqual(names(response.header("allow")), ["POST", "OPTIONS"])
            self.assertIsNone(response.header("access-control-allow-origin"))

    def test_private_network_access(self) -> None:
        response = self.only(
            preflight(
                "/v1/chat/completions", extra="Access-Control-Request-Private-Network: true\r\n"
            )
        )
        self.assertEqual(response.header("access-control-allow-private-network"), "true")
        response = self.only(preflight("/v1/chat/completions"))
        self.assertIsNone(response.header("access-control-allow-private-network"))

    def test_header_names_asked_are_bounded_and_checked(self) -> None:
        asked = ", ".join(f"x-h{i}" for i in range(200)) + ", bad name, (x)"
        response = self.only(
            preflight("/v1/chat/completions", extra=f"Access-Control-Request-Headers: {asked}\r\n")
        )
        allowed = names(response.header("access-control-allow-headers"))
        self.assertEqual(len(allowed), len(ALLOW_HEADERS) + 64)
        self.assertNotIn("bad name", allowed)

    def test_405_names_options(self) -> None:
        response = self.only(b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n\r\n")
        self.assertEqual(response.status, 405)
        self.assertEqual(names(response.header("allow")), ["OPTIONS", "POST"])


class AnswerHeaderTests(WireCase):
    def request(self, origin: str | None, key: str | None = KEY) -> Response:
        lines = ["GET /v1/models HTTP/1.1", "Host: edge"]
        if origin is not None:
            lines.append(f"Origin: {origin}")
        if key is not None:
            lines.append(f"Authorization: Bearer {key}")
        return self.only(("\r\n".join(lines) + "\r\n\r\n").encode())

    def test_allowed_origin(self) -> None:
        response = self.request(SITE)
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header("access-control-allow-origin"), SITE)
        self.assertEqual(names(response.header("access-control-expose-headers")), [*EXPOSE_HEADERS])
        self.assertEqual(response.header("vary"), "Origin")

    def test_an_error_carries_them(self) -> None:
        response = self.request(SITE, key=None)
        self.assertEqual(response.status, 401)
        self.assertEqual(response.header("access-control-allow-origin"), SITE)
        self.assertEqual(response.header("x-should-retry"), "false")

    def test_other_origin_is_served_without_them(self) -> None:
        for origin in (OTHER, None):
            response = self.request(origin)
            self.assertEqual(response.status, 200)
            self.assertIsNone(response.header("access-control-allow-origin"))
            self.assertEqual(response.header("vary"), "Origin")

    def test_the_connection_refusals_carry_them(self) -> None:
        # The Origin line after Content-Length, as browsers send it.
        too_large = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"
            f"Content-Length: {BODY_LIMIT + 1}\r\nContent-Type: application/json\r\n"
            f"Origin: {SITE}\r\n\r\n"
        ).encode()
        response = self.only(too_large)
        self.assertEqual(response.status, 413)
        self.assertEqual(response.header("access-control-allow-origin"), SITE)
        connection = self.wire.connect()
        connection.send(f"GET /v1/models HTTP/1.1\r\nOrigin: {SITE}\r\nHost: e".encode())
        self.wire.advance(60)
        response = connection.only()
        self.assertEqual(response.status, 408)
        self.assertEqual(response.header("access-control-allow-origin"), SITE)
        response = self.only(f"PUT /v1/models HTTP/1.1\r\nOrigin: {OTHER}\r\n\r\n".encode())
        self.assertEqual(response.status, 405)
        self.assertIsNone(response.header("access-control-allow-origin"))


class AnyOriginTests(WireCase):
    cors = CorsConfig(allow_origins=("*",))

    def test_star(self) -> None:
        response = self.only(preflight("/v1/messages", origin=OTHER))
        self.assertEqual(response.status, 204)
        self.assertEqual(response.header("access-control-allow-origin"), "*")
        self.assertIsNone(response.header("vary"))
        self.assertEqual(response.header("access-control-max-age"), "600")
        models = f"GET /v1/models HTTP/1.1\r\nOrigin: {OTHER}\r\nx-api-key: {KEY}\r\n\r\n"
        response = self.only(models.encode())
        self.assertEqual(response.status, 200)
        self.assertEqual(response.header("access-control-allow-origin"), "*")


class OffTests(WireCase):
    cors = None

    def test_options_is_not_served(self) -> None:
        response = self.only(preflight("/v1/chat/completions"))
        self.assertEqual(response.status, 405)
        self.assertEqual(names(response.header("allow")), ["POST"])
        self.assertFalse([h for h in response.headers if h.startswith("access-control-")])
        self.assertEqual(self.wire.served(), 0)

    def test_answers_carry_nothing(self) -> None:
        response = self.only(
            f"GET /v1/models HTTP/1.1\r\nOrigin: {SITE}\r\nx-api-key: {KEY}\r\n\r\n".encode()
        )
        self.assertEqual(response.status, 200)
        self.assertFalse([h for h in response.headers if h.startswith("access-control-")])
        self.assertIsNone(response.header("vary"))


class StreamTests(IngressCase):
    cors = CORS

    def test_a_stream_carries_them(self) -> None:
        d = self.edge.post(
            "/v1/chat/completions", {**CHAT, "stream": True}, headers={"origin": SITE}
        )
        self.edge.flush()
        sent = self.edge.tunnel_request()
        chunk = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        self.edge.frames(sent.run_id, start(200, "text/event-stream"), body(chunk))
        response: Any = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("access-control-allow-origin"), [SITE])
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        content = response.content()
        self.edge.frames(sent.run_id, body(b"data: [DONE]\n\n"), END)
        self.assertEqual(self.successResultOf(content), chunk + b"data: [DONE]\n\n")
        self.assertEqual(self.edge.in_flight(), 0)
