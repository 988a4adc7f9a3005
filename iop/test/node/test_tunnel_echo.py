# -*- test-case-name: iop.test.node.test_tunnel_echo -*-
"""
Managed mode: an upstream that echoes the leased credential. The node removes it from the
response headers and every body chunk (an echo split across chunks too) before anything goes
to the Edge, counts it in the last frame's metadata and one warning, and zeroes its copy when
the tunnel ends; a legacy tunnel's body is passed through as it is.
"""

from __future__ import annotations

from twisted.logger import LogLevel, formatEvent
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from iop.node.tunnel import TunnelManager
from iop.runtime.codes import ERROR_CODE_KEY
from iop.security.echo import ECHOES_METADATA_KEY
from iop.test.node.test_tunnel import Scripted, TunnelCase, chat
from iop.test.node.test_tunnel_lease import LEASED, ManagedCase
from iop.wire import runtime_pb2 as pb

HEADER = b"Bearer " + LEASED


class Echoing(Resource):
    """Answers with ``code`` and headers that echo the request's Authorization; the test writes
    the body (:meth:`write`) and ends it (:meth:`finish`, :meth:`cut`) turn by turn."""

    isLeaf = True

    def __init__(self, code: int = 200) -> None:
        super().__init__()
        self.code = code
        self.request: Request | None = None
        self.seen: list[bytes] = []

    def render(self, request: Request) -> int:
        credential = request.getHeader(b"authorization") or b""
        self.seen.append(credential)
        request.setResponseCode(self.code, b"Unauthorized " + credential)
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"x-request-id", b"req " + credential)
        request.setHeader(b"x-echo-" + credential.split()[-1], b"1")
        request.notifyFinish().addErrback(lambda _: None)
        self.request = request
        request.write(b"")
        return NOT_DONE_YET

    def write(self, data: bytes) -> None:
        assert self.request is not None
        self.request.write(data)

    def finish(self) -> None:
        assert self.request is not None
        self.request.finish()

    def cut(self) -> None:
        assert self.request is not None
        self.request.channel.transport.loseConnection()  # type: ignore[union-attr]


class EchoTests(ManagedCase):
    def start(self, code: int = 200) -> Echoing:
        echoing = Echoing(code)
        self.managed(echoing)
        self.leased(stream=True)
        self.assertEqual(echoing.seen, [HEADER])
        return echoing

    def warnings(self) -> list[str]:
        return [
            formatEvent(e)
            for e in self.events
            if e.get("log_level") == LogLevel.warn and "echoed" in formatEvent(e)
        ]

    def test_headers_and_a_body_split_mid_secret(self) -> None:
        echoing = self.start()
        [start] = [f for f in self.frames() if f.kind == pb.RESPONSE_START]
        headers = [(h.name.lower(), h.value) for h in start.headers]
        self.assertIn(("x-request-id", "req Bearer [redacted]"), headers)
        # A header whose name carries the secret is dropped.
        self.assertEqual([n for n, _ in headers if n.startswith("x-echo-")], [])
        echoing.write(b'data: {"k": "' + HEADER[:20])
        self.end_turn()
        # Held back: only the tail that may still become the secret.
        self.assertEqual(self.body(), b'data: {"k": "Bearer ')
        echoing.write(HEADER[20:] + b'"}\n\n')
        self.end_turn()
        echoing.write(b"data: " + LEASED[:-1])
        self.end_turn()
        echoing.write(LEASED[-1:] + b"\n\ndata: [DONE]\n\n")
        echoing.finish()
        self.end_turn()
        self.assertEqual(
            self.body(),
            b'data: {"k": "Bearer [redacted]"}\n\ndata: [redacted]\n\ndata: [DONE]\n\n',
        )
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        # Two header echoes (value; name) and two in the body.
        self.assertEqual(dict(self.last().metadata), {ECHOES_METADATA_KEY: "4"})
        self.assertValid()
        [warning] = self.warnings()
        self.assertIn("4 occurrence(s)", warning)

    def test_a_401_echoing_the_header(self) -> None:
        echoing = self.start(401)
        echoing.write(b'{"error": {"message": "Incorrect API key provided: ' + HEADER + b'"}}')
        echoing.finish()
        self.end_turn()
        self.assertEqual(
            self.body(),
            b'{"error": {"message": "Incorrect API key provided: Bearer [redacted]"}}',
        )
        [start] = [f for f in self.frames() if f.kind == pb.RESPONSE_START]
        self.assertEqual(start.status_code, 401)
        self.assertEqual(dict(self.last().metadata), {ECHOES_METADATA_KEY: "3"})

    def test_a_body_cut_mid_secret_does_not_hand_out_its_first_bytes(self) -> None:
        echoing = self.start(500)
        echoing.write(b"debug: " + HEADER[:-1])
        self.end_turn()
        echoing.cut()
        self.end_turn()
        self.assertEqual(self.kinds(), ["start", "body+", "error"])
        self.assertEqual(self.body(), b"debug: Bearer ")
        # The headers' two echoes still count, on the ERROR frame.
        self.assertEqual(self.last().metadata[ECHOES_METADATA_KEY], "2")
        self.assertNotIn(ERROR_CODE_KEY, self.last().metadata)
        self.assertValid()

    def test_a_cancel_mid_echo(self) -> None:
        echoing = self.start()
        echoing.write(b"x " + LEASED[:12])
        self.end_turn()
        self.assertTrue(self.tunnels.cancel("t1", "client gone"))
        self.end_turn()
        self.assertEqual(self.body(), b"x ")
        self.assertEqual(self.kinds(), ["start", "body+", "error"])

    def test_no_echo_no_metadata(self) -> None:
        self.managed(Scripted([b"data: sk-leased-but-not-quite\n\n", b"data: [DONE]\n\n"]))
        self.leased(stream=True)
        self.assertEqual(self.body(), b"data: sk-leased-but-not-quite\n\ndata: [DONE]\n\n")
        self.assertEqual(dict(self.last().metadata), {})
        self.assertEqual(self.warnings(), [])


class LegacyTests(TunnelCase):
    def test_a_legacy_tunnel_body_is_passed_through(self) -> None:
        # Passthrough: the configured key, if the upstream echoes it in a body, goes back as it
        # is (header values are cleaned by the adapter's own redaction, as before).
        secret = b"sk-legacy-configured-0123456789"
        self.use_resource(
            Scripted([b"key: " + secret], code=401, extra_headers={b"x-request-id": secret}),
            headers={"Authorization": "Bearer " + secret.decode()},
        )
        self.tunnels = TunnelManager(self.registry, self.sent.append, self.clock)
        self.open(chat(stream=False))
        self.assertEqual(self.body(), b"key: " + secret)
        [start] = [f for f in self.frames() if f.kind == pb.RESPONSE_START]
        self.assertIn(
            ("x-request-id", "[redacted]"), [(h.name.lower(), h.value) for h in start.headers]
        )
        self.assertEqual(dict(self.last().metadata), {})
