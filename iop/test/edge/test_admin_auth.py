# -*- test-case-name: iop.test.edge.test_admin_auth -*-
"""
Tests for :mod:`iop.edge.admin_auth`: the admin bearer token in front of every admin route, and
the Edge service tree putting it there when ``admin.auth`` is set.
"""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import IResource

from iop.config.model import AdminConfig, EdgeConfig, HeartbeatConfig, NodeToken
from iop.edge import admin_auth, tap
from iop.edge.admin import AdminApp
from iop.edge.admin_auth import BearerAuthResource, protect
from iop.edge.console.assets import PublicShell
from iop.edge.refresh.classify import classify

ADMIN_TOKEN = "admin-token-for-tests"


def admin_app() -> AdminApp:
    return AdminApp(lambda: {"nodes": []})


class BearerAuthTests(SynchronousTestCase):
    def setUp(self) -> None:
        config = AdminConfig(auth=NodeToken.from_plaintext(ADMIN_TOKEN))
        self.resource = protect(admin_app().resource(), config)
        self.treq: Any = StubTreq(self.resource)

    def get(self, path: str, headers: dict[str, list[str]] | None = None) -> tuple[Any, Any]:
        response = self.successResultOf(self.treq.get(f"http://admin{path}", headers=headers))
        return response, self.successResultOf(response.content())

    def assertUnauthorized(self, response: Any, body: bytes, invalid: bool) -> None:
        self.assertEqual(response.code, 401)
        challenge = response.headers.getRawHeaders(b"www-authenticate")
        self.assertEqual(len(challenge), 1)
        self.assertTrue(challenge[0].startswith(b"Bearer "))
        self.assertEqual(b'error="invalid_token"' in challenge[0], invalid)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"application/json"])
        document = json.loads(body)
        self.assertEqual(document["error"]["code"], 401)
        self.assertIsInstance(document["error"]["message"], str)
        self.assertNotIn(ADMIN_TOKEN.encode(), body)

    def test_noToken(self) -> None:
        for path in ("/status", "/healthz", "/", "/runs", "/metrics", "/no/such/route"):
            response, body = self.get(path)
            self.assertUnauthorized(response, body, invalid=False)

    def test_wrongToken(self) -> None:
        for value in (f"Bearer {ADMIN_TOKEN}x", "Bearer wrong", f"Bearer {ADMIN_TOKEN[:-1]}"):
            response, body = self.get("/status", {"Authorization": [value]})
            self.assertUnauthorized(response, body, invalid=True)

    def test_notBearer(self) -> None:
        for value in (f"Basic {ADMIN_TOKEN}", ADMIN_TOKEN, "Bearer", "Bearer   "):
            response, body = self.get("/status", {"Authorization": [value]})
            self.assertUnauthorized(response, body, invalid=False)

    def test_twoHeaders(self) -> None:
        """Two Authorization headers are ambiguous: refused even if one is right."""
        headers = {"Authorization": [f"Bearer {ADMIN_TOKEN}", "Bearer other"]}
        response, body = self.get("/status", headers)
        self.assertUnauthorized(response, body, invalid=False)

    def test_rightToken(self) -> None:
        for scheme in ("Bearer", "bearer", "BEARER"):
            response, body = self.get("/status", {"Authorization": [f"{scheme} {ADMIN_TOKEN}"]})
            self.assertEqual(response.code, 200)
            self.assertEqual(json.loads(body), {"nodes": []})

    def test_rightTokenEveryRoute(self) -> None:
        """The wrapped tree routes as before: its own 404 and 405 answers come through."""
        headers = {"Authorization": [f"Bearer {ADMIN_TOKEN}"]}
        response, _ = self.get("/healthz", headers)
        self.assertEqual(response.code, 200)
        response, _ = self.get("/no/such/route", headers)
        self.assertEqual(response.code, 404)

    def test_postRefused(self) -> None:
        response = self.successResultOf(
            self.treq.post("http://admin/config/refresh", data=b'{"mode": "apply"}')
        )
        self.assertEqual(response.code, 401)

    def test_constantTimeCompare(self) -> None:
        """The check is hmac.compare_digest over sha256 digests, for right and wrong tokens."""
        calls: list[tuple[bytes, bytes]] = []

        def spy(a: bytes, b: bytes) -> bool:
            calls.append((a, b))
            return a == b

        self.patch(admin_auth, "compare_digest", spy)
        self.get("/status", {"Authorization": ["Bearer wrong"]})
        self.get("/status", {"Authorization": [f"Bearer {ADMIN_TOKEN}"]})
        self.assertEqual(len(calls), 2)
        for expected, presented in calls:
            self.assertEqual(len(expected), 32)
            self.assertEqual(len(presented), 32)

    def test_reprHidesToken(self) -> None:
        self.assertEqual(repr(self.resource), "BearerAuthResource(token=***)")


class ProtectTests(SynchronousTestCase):
    def test_noAuthIsUnwrapped(self) -> None:
        resource = admin_app().resource()
        self.assertIs(protect(resource, AdminConfig()), resource)

    def test_noAuthServesOpen(self) -> None:
        treq: Any = StubTreq(protect(admin_app().resource(), AdminConfig()))
        response = self.successResultOf(treq.get("http://admin/status"))
        self.assertEqual(response.code, 200)

    def test_providesIResource(self) -> None:
        config = AdminConfig(auth=NodeToken.from_plaintext(ADMIN_TOKEN))
        self.assertTrue(IResource.providedBy(protect(admin_app().resource(), config)))


def edge_config(admin: AdminConfig) -> EdgeConfig:
    return EdgeConfig(
        id="edge",
        node_listen="tcp:0:interface=127.0.0.1",
        admin_listen="tcp:0:interface=127.0.0.1",
        tls=None,
        plaintext_nodes=True,
        heartbeat=HeartbeatConfig(),
        max_frame_bytes=1 << 20,
        register_timeout_sec=10.0,
        nodes=(),
        admin=admin,
    )


class ServiceWiringTests(SynchronousTestCase):
    """makeService puts the admin listener's Site behind the check when admin.auth is set."""

    def admin_resource(self, admin: AdminConfig) -> object:
        options = tap.Options()
        options.edge_config = edge_config(admin)
        service: Any = tap.makeService(options, MemoryReactorClock())
        return service.getServiceNamed("admin").factory.resource

    def test_wrappedWithAuth(self) -> None:
        """Behind the check, but for the console's static shell (iop.edge.console.assets)."""
        admin = AdminConfig(auth=NodeToken.from_plaintext(ADMIN_TOKEN))
        resource = self.admin_resource(admin)
        self.assertIsInstance(resource, PublicShell)
        assert isinstance(resource, PublicShell)
        self.assertIsInstance(resource.protected, BearerAuthResource)

    def test_openWithoutAuth(self) -> None:
        self.assertNotIsInstance(self.admin_resource(AdminConfig()), BearerAuthResource)


class RefreshTests(SynchronousTestCase):
    def test_authChangeIsRestartRequiredAndSecret(self) -> None:
        """A new admin token takes a restart; the report never shows it."""
        running = edge_config(AdminConfig())
        candidate = edge_config(AdminConfig(auth=NodeToken.from_plaintext(ADMIN_TOKEN)))
        (report,) = classify(running, candidate)
        self.assertEqual(report.path, "admin.auth")
        self.assertEqual(report.change_class, "restart_required")
        self.assertEqual((report.old, report.new), ("<secret changed>", "<secret changed>"))
        self.assertEqual(classify(candidate, candidate), [])
