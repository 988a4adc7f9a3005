# -*- test-case-name: iop.test.node.test_tunnel_lease -*-
"""
Managed mode on the Node's provider tunnel: credential leases verified after admission and
opened immediately before the provider call, the profile's header put on that one upstream
request, every failure class as one ERROR frame with nothing reaching the upstream, the secret
absent from frames and logs, the plaintext zeroed, the capacity gate back to 0 on every path;
and the node's startup loading of its lease keys.
"""

from __future__ import annotations

import os
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel, formatEvent
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.web.resource import Resource

from iop.config.model import (
    NodeDaemonConfig,
    NodeSecurity,
    ProfileConfig,
    ReconnectPolicy,
    Secret,
)
from iop.edge.payload import _profile_message
from iop.node import tap as node_tap
from iop.node.adapters.registry import AdapterInstance, AdapterRegistry
from iop.node.handlers import make_session_setup
from iop.node.session import NodeSession
from iop.node.tunnel import TunnelManager
from iop.runtime import AdapterContext, TreqClient
from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode, error_code
from iop.security.keys import (
    KEM_MLKEM768_X25519,
    KEMS,
    generate_issuer,
    generate_recipient,
    write_issuer,
    write_recipient,
)
from iop.security.lease import (
    LEASE_ERRORS,
    SIGNATURE_CONTEXT,
    LeaseVerifier,
    NodeLeaseKeys,
    ReplayCache,
    issue_lease,
)
from iop.test.node.test_runs import open_store
from iop.test.node.test_tunnel import Hanging, Scripted, TunnelCase, chat
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import adapter_spec, runtime_profile

NODE = "node-a"
LEASED = b"sk-leased-7d1f0a9b3c5e8f2a4b6c8d0e1f3a5b7c"
ISSUER = generate_issuer()
RECIPIENTS = {kem: generate_recipient(kem) for kem in KEMS}
RECIPIENT = RECIPIENTS[KEMS[0]]
PROFILE = pb.RuntimeProfile(
    name="openai",
    driver="openai_chat",
    auth_header="Authorization",
    auth_scheme="Bearer",
)


def binding(**changes: Any) -> pb.CredentialBinding:
    fields: dict[str, Any] = {
        "principal": "client-1",
        "slot": "openai-main",
        "route": "demo",
        "profile": "openai",
        "target": "demo-model",
        "node_recipient": NODE,
        "credential_revision": 1,
        "route_revision": 1,
        "projection_generation": 4,
        # The adapter instance TunnelCase configures ("up", base_url http://upstream.test/v1/).
        "adapter": "up",
        "upstream_origin": "http://upstream.test:80",
    }
    fields.update(changes)
    return pb.CredentialBinding(**fields)


class RecordingVerifier(LeaseVerifier):
    """A real verifier that also keeps every secret buffer it hands out in ``handed_out``."""

    def __init__(self, handed_out: list[bytearray], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handed_out = handed_out

    def open(self, lease: bytes, binding: pb.CredentialBinding, now: float) -> bytearray:
        secret = super().open(lease, binding, now)
        self.handed_out.append(secret)
        return secret


class ManagedCase(TunnelCase):
    def setUp(self) -> None:
        super().setUp()
        self.replay = ReplayCache()
        self.handed_out: list[bytearray] = []
        self.addCleanup(self.assertSecretNowhere)

    def managed(
        self,
        resource: Resource | None = None,
        profile: pb.RuntimeProfile = PROFILE,
        kem: str = KEMS[0],
        **config_fields: Any,
    ) -> Any:
        resource = (
            resource
            if resource is not None
            else Scripted([b"{}"], content_type=b"application/json")
        )
        fields: dict[str, Any] = {"headers": {}, "profile": profile}
        fields.update(config_fields)
        self.use_resource(resource, **fields)
        self.handed_out.clear()
        self.verifier = RecordingVerifier(
            self.handed_out,
            node_id=NODE,
            recipient=RECIPIENTS[kem],
            issuer=ISSUER.public_key(),
            clock_skew_sec=5.0,
            replay=self.replay,
        )
        self.tunnels = TunnelManager(
            self.registry, self.sent.append, self.clock, node_id=NODE, leases=self.verifier
        )
        return resource

    def lease(
        self,
        secret: bytes = LEASED,
        kem: str = KEMS[0],
        ttl: float = 30.0,
        now: float | None = None,
        **changes: Any,
    ) -> bytes:
        return issue_lease(
            binding=binding(**changes),
            secret=secret,
            recipient=RECIPIENTS[kem].public_key(),
            issuer=ISSUER,
            now=self.clock.seconds() if now is None else now,
            ttl_sec=ttl,
        )

    def leased(
        self, lease: bytes | None = None, bound: pb.CredentialBinding | None = None, **fields: Any
    ) -> None:
        """Open a tunnel with ``lease`` (a fresh valid one by default) and ``bound``."""
        values: dict[str, Any] = {
            "profile": "openai",
            "credential_lease": self.lease() if lease is None else lease,
            "credential_binding": binding() if bound is None else bound,
        }
        values.update(fields)
        self.open(chat(stream=False), **values)

    def assertSecretNowhere(self) -> None:
        text = LEASED.decode()
        for envelope in self.sent:
            self.assertNotIn(LEASED, envelope.SerializeToString())
        for event in self.events:
            self.assertNotIn(text, formatEvent(event))
            self.assertNotIn(text, repr(event))
        for buffer in self.handed_out:
            self.assertEqual(bytes(buffer), bytes(len(buffer)), "a secret buffer was not zeroed")

    def assertFailed(self, code: str, scripted: Scripted, run_id: str = "t1") -> str:
        """One ERROR frame naming ``code`` (text and metadata), nothing upstream, gate empty."""
        frames = self.frames(run_id)
        self.assertEqual([f.kind for f in frames], [pb.ERROR], frames)
        [frame] = frames
        self.assertTrue(frame.error.startswith(f"{code}: "), frame.error)
        self.assertEqual(dict(frame.metadata), {ERROR_CODE_KEY: code})
        self.assertEqual(error_code(frame.metadata), ErrorCode(code))
        self.assertEqual(scripted.seen, [])
        self.assertValid(run_id)
        return frame.error


class ManagedTunnelTests(ManagedCase):
    def test_valid_lease_reaches_upstream_with_exactly_the_header(self) -> None:
        scripted = self.managed()
        self.leased()
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertValid()
        [(method, uri, headers, _)] = scripted.seen
        self.assertEqual(headers["authorization"], [f"Bearer {LEASED.decode()}"])
        self.assertNotIn("x-api-key", headers)
        self.assertEqual((method, uri), ("POST", "/v1/chat/completions"))
        [buffer] = self.verifier.handed_out
        self.assertEqual(bytes(buffer), bytes(len(LEASED)))

    def test_both_kems(self) -> None:
        for kem in KEMS:
            scripted = self.managed(kem=kem)
            self.leased(self.lease(kem=kem), run_id=kem)
            self.assertEqual(self.kinds(kem), ["start", "body+", "end"])
            [(_, _, headers, _)] = scripted.seen
            self.assertEqual(headers["authorization"], [f"Bearer {LEASED.decode()}"])

    def test_bare_secret_without_scheme(self) -> None:
        profile = pb.RuntimeProfile(name="openai", driver="anthropic_messages")
        profile.auth_header = "x-api-key"
        scripted = self.managed(profile=profile)
        self.leased(operation="messages")
        [(_, _, headers, _)] = scripted.seen
        self.assertEqual(headers["x-api-key"], [LEASED.decode()])
        self.assertNotIn("authorization", headers)

    def test_lease_replaces_configured_and_requested_credentials(self) -> None:
        """An adapter header or a request header of that name never wins over the lease."""
        scripted = self.managed(headers={"Authorization": "Bearer configured"})
        self.leased(headers=[("authorization", "Bearer from-client")])
        [(_, _, headers, _)] = scripted.seen
        self.assertEqual(headers["authorization"], [f"Bearer {LEASED.decode()}"])

    def test_one_request_only(self) -> None:
        """The next tunnel, legacy-looking (no lease), carries no credential at all."""
        scripted = self.managed()
        self.leased()
        self.open(chat(stream=False), run_id="t2")
        self.assertEqual(len(scripted.seen), 1)
        self.assertTrue(self.last("t2").error.startswith("lease_missing: "))

    def test_a_provider_without_a_credential_slot(self) -> None:
        """A lease bound to no slot authorizes the request and adds no header, even where the
        profile names none."""
        for i, profile in enumerate((PROFILE, pb.RuntimeProfile(name="openai", driver="x"))):
            scripted = self.managed(profile=profile, headers={"X-Local": "1"})
            run_id = f"t{i}"
            self.leased(self.lease(secret=b"", slot=""), binding(slot=""), run_id=run_id)
            self.assertEqual(self.kinds(run_id), ["start", "body+", "end"])
            [(_, _, headers, _)] = scripted.seen
            self.assertNotIn("authorization", headers)
            self.assertEqual(headers["x-local"], ["1"])

    def test_a_secret_under_no_slot_is_refused(self) -> None:
        scripted = self.managed()
        self.leased(self.lease(slot=""), binding(slot=""))
        self.assertFailed("lease_malformed", scripted)

    def test_the_manager_describes_no_secret(self) -> None:
        self.managed(Hanging())
        self.leased()
        self.assertNotIn(LEASED.decode(), repr(self.tunnels.describe()))
        self.tunnels.cancel("t1")


class ManagedFailureTests(ManagedCase):
    def test_missing(self) -> None:
        scripted = self.managed()
        self.open(chat(stream=False), profile="openai")
        self.assertFailed("lease_missing", scripted)

    def test_lease_without_binding(self) -> None:
        scripted = self.managed()
        self.open(chat(stream=False), profile="openai", credential_lease=self.lease())
        self.assertFailed("lease_malformed", scripted)

    def test_binding_without_lease(self) -> None:
        scripted = self.managed()
        self.open(chat(stream=False), profile="openai", credential_binding=binding())
        self.assertFailed("lease_missing", scripted)

    def test_malformed(self) -> None:
        scripted = self.managed()
        self.leased(b"\x00garbage")
        self.assertFailed("lease_malformed", scripted)

    def test_bad_signature(self) -> None:
        scripted = self.managed()
        envelope = pb.CredentialLeaseEnvelope.FromString(self.lease())
        envelope.signature = generate_issuer().sign(SIGNATURE_CONTEXT + envelope.payload)
        self.leased(envelope.SerializeToString())
        self.assertFailed("lease_bad_signature", scripted)

    def test_wrong_recipient(self) -> None:
        scripted = self.managed()
        self.leased(self.lease(node_recipient="node-b"), binding(node_recipient="node-b"))
        self.assertFailed("lease_wrong_recipient", scripted)

    def test_wrong_kem(self) -> None:
        scripted = self.managed()
        self.leased(self.lease(kem=KEM_MLKEM768_X25519))
        self.assertFailed("lease_wrong_recipient", scripted)

    def test_expired(self) -> None:
        scripted = self.managed()
        lease = self.lease()
        self.clock.advance(30 + 5 + 0.001)
        self.leased(lease)
        self.assertFailed("lease_expired", scripted)
        [event] = [e for e in self.events if e.get("error_code") == "lease_expired"]
        self.assertEqual(event["log_level"], LogLevel.warn)
        self.assertIn("credential lease refused: lease_expired: ", formatEvent(event))

    def test_skew_edge_still_opens(self) -> None:
        scripted = self.managed()
        lease = self.lease()
        self.clock.advance(30 + 5)
        self.leased(lease)
        self.assertEqual(len(scripted.seen), 1)

    def test_binding_mismatch_with_the_lease(self) -> None:
        scripted = self.managed()
        self.leased(self.lease(), binding(credential_revision=2))
        error = self.assertFailed("lease_binding_mismatch", scripted)
        self.assertIn("credential_revision", error)

    def test_binding_mismatch_with_the_request(self) -> None:
        """The binding (lease and request agree) names another target or profile."""
        cases: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
            "target": ({"target": "other-model"}, {}),
            "profile": ({"profile": "other"}, {}),
            "request profile": ({}, {"profile": "other"}),
        }
        for i, (name, (bound, request)) in enumerate(cases.items()):
            scripted = self.managed()
            run_id = f"t{i}"
            self.leased(self.lease(**bound), binding(**bound), run_id=run_id, **request)
            error = self.assertFailed("lease_binding_mismatch", scripted, run_id)
            self.assertIn("request's", error, name)

    def test_binding_mismatch_with_the_adapter_profile(self) -> None:
        """Request and binding agree on a profile the adapter is not configured with."""
        scripted = self.managed(
            profile=pb.RuntimeProfile(name="anthropic", auth_header="x-api-key")
        )
        self.leased()
        error = self.assertFailed("lease_binding_mismatch", scripted)
        self.assertIn("adapter profile", error)

    def test_a_lease_for_another_adapter_or_upstream(self) -> None:
        """
        The binding (lease and request agree) names another adapter instance or another
        upstream origin than the adapter that would receive the request: refused, nothing sent.
        """
        cases: dict[str, dict[str, Any]] = {
            "adapter": {"adapter": "other-adapter"},
            "upstream origin": {"upstream_origin": "http://elsewhere.test:80"},
            "port": {"upstream_origin": "http://upstream.test:8080"},
            "scheme": {"upstream_origin": "https://upstream.test:443"},
            "unbound adapter": {"adapter": ""},
            "unbound origin": {"upstream_origin": ""},
        }
        for i, (name, bound) in enumerate(cases.items()):
            scripted = self.managed()
            run_id = f"t{i}"
            self.leased(self.lease(**bound), binding(**bound), run_id=run_id)
            error = self.assertFailed("lease_binding_mismatch", scripted, run_id)
            field = "upstream origin" if "adapter" not in bound else "adapter"
            self.assertIn(f"request's {field}", error, name)

    def test_a_lease_for_the_adapter_behind_a_type_reference(self) -> None:
        """The check is against the instance the request resolves to (``openai_compat``→up)."""
        scripted = self.managed()
        self.leased(adapter="openai_compat")
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertEqual(len(scripted.seen), 1)

    def test_a_lease_for_one_adapter_replayed_into_another(self) -> None:
        """Two adapters on one node, the same profile and target: A's lease does not open B."""
        scripted = self.managed()
        other = Scripted([b"{}"], content_type=b"application/json")
        second = pb.AdapterConfig(
            name="up-b",
            type="openai_compat",
            enabled=True,
            base_url="http://upstream-b.test/v1",
            max_concurrency=1,
            profile=PROFILE,
        )
        ctx = AdapterContext(self.clock, cast(TreqClient, StubTreq(other)))
        registry = AdapterRegistry(
            [self.instance, AdapterInstance.from_spec(adapter_spec(second), ctx)]
        )
        self.tunnels = TunnelManager(
            registry, self.sent.append, self.clock, node_id=NODE, leases=self.verifier
        )
        self.leased(adapter="up-b")  # a lease bound to "up", sent to "up-b"
        error = self.assertFailed("lease_binding_mismatch", other)
        self.assertIn("adapter, upstream origin", error)
        self.assertEqual(scripted.seen, [])
        # Refused before the lease was opened: no secret was ever handed out.
        self.assertEqual(self.handed_out, [])

    def test_replayed(self) -> None:
        scripted = self.managed()
        lease = self.lease()
        self.leased(lease)
        self.assertEqual(len(scripted.seen), 1)
        self.leased(lease, run_id="t2")
        self.assertEqual(len(scripted.seen), 1)
        scripted.seen.clear()
        self.assertFailed("lease_replayed", scripted, "t2")

    def test_unopenable(self) -> None:
        scripted = self.managed()
        envelope = pb.CredentialLeaseEnvelope.FromString(self.lease())
        payload = pb.CredentialLeasePayload.FromString(envelope.payload)
        payload.sealed = payload.sealed[:-1] + bytes([payload.sealed[-1] ^ 1])
        raw = payload.SerializeToString()
        tampered = pb.CredentialLeaseEnvelope(
            payload=raw,
            signature=ISSUER.sign(SIGNATURE_CONTEXT + raw),
            issuer_key_id=ISSUER.key_id,
        ).SerializeToString()
        self.leased(tampered)
        self.assertFailed("lease_unopenable", scripted)

    def test_replay_cache_full(self) -> None:
        scripted = self.managed()
        self.verifier.replay = ReplayCache(capacity=1)
        self.leased()
        scripted.seen.clear()
        self.leased(run_id="t2")
        self.assertFailed("lease_replay_cache_full", scripted, "t2")

    def test_secret_not_a_header_value(self) -> None:
        """A credential with CR/LF never becomes a header (and its buffer is still zeroed)."""
        for i, bad in enumerate([b"sk-x\r\nX-Evil: 1", b" sk-padded", b"sk-\x00"]):
            scripted = self.managed()
            run_id = f"t{i}"
            self.leased(self.lease(secret=bad), run_id=run_id)
            self.assertFailed("lease_malformed", scripted, run_id)
            [buffer] = self.verifier.handed_out
            self.assertEqual(bytes(buffer), bytes(len(bad)))

    def test_profile_without_auth_header(self) -> None:
        scripted = self.managed(profile=pb.RuntimeProfile(name="openai", driver="openai_chat"))
        self.leased()
        [frame] = self.frames()
        self.assertIn("auth_header", frame.error)
        self.assertEqual(scripted.seen, [])
        self.assertValid()

    def test_at_capacity_does_not_consume_the_lease(self) -> None:
        """Admission comes first: a full gate refuses before the lease is opened."""
        hanging = Hanging()
        self.managed(hanging)
        self.leased(run_id="t1")
        lease = self.lease()
        self.leased(lease, run_id="t2")
        self.assertEqual(error_code(self.last("t2").metadata), ErrorCode.PROVIDER_AT_CAPACITY)
        self.assertEqual(len(self.replay), 1)
        self.tunnels.cancel("t1")
        self.assertEqual(self.instance.gate.in_use, 0)
        self.leased(lease, run_id="t3")
        self.assertEqual(len(self.replay), 2)
        self.tunnels.cancel("t3")
        self.assertValid("t3")

    def test_every_class_is_an_error_code(self) -> None:
        self.assertLessEqual(set(LEASE_ERRORS), {code.value for code in ErrorCode})


class LegacyNodeTests(TunnelCase):
    def test_legacy_refuses_leases(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        self.use_resource(scripted)
        cases: list[dict[str, Any]] = [
            {"credential_lease": b"x"},
            {"credential_binding": binding()},
            {"credential_lease": b"x", "credential_binding": binding()},
        ]
        for i, fields in enumerate(cases):
            self.open(chat(stream=False), run_id=f"t{i}", **fields)
            self.assertIn("not supported by this node", self.last(f"t{i}").error)
        self.assertEqual(scripted.seen, [])

    def test_legacy_without_lease_unchanged(self) -> None:
        scripted = Scripted([b"{}"], content_type=b"application/json")
        self.use_resource(scripted)
        self.open(chat(stream=False))
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        self.assertEqual(len(scripted.seen), 1)


class SessionWiringTests(ManagedCase):
    """make_session_setup gives each session's tunnels a verifier for the session's node id."""

    def session(self, node_id: str, keys: NodeLeaseKeys | None) -> NodeSession:
        config = pb.NodeConfigPayload(node_id=node_id, adapters=[self.config])
        session = NodeSession(node_id, config, self.registry, self.sent.append, self.clock)
        make_session_setup(open_store(self, self.clock), self.clock, leases=keys)(session)
        return session

    def test_managed_session(self) -> None:
        scripted = self.managed()
        keys = NodeLeaseKeys(recipient=RECIPIENT, issuer=ISSUER.public_key(), clock_skew_sec=5)
        lease = self.lease()
        request = self.request(
            chat(stream=False),
            profile="openai",
            credential_lease=lease,
            credential_binding=binding(),
        )
        session = self.session(NODE, keys)
        session.envelope_received(pb.Envelope(provider_tunnel_request=request))
        self.http.flush()
        self.assertEqual(self.kinds(), ["start", "body+", "end"])
        # A new session (a reconnect) shares the replay cache: the lease stays spent.
        session.connection_lost(_lost())
        request.run_id = "t2"
        self.session(NODE, keys).envelope_received(pb.Envelope(provider_tunnel_request=request))
        self.assertTrue(self.last("t2").error.startswith("lease_replayed: "))
        self.assertEqual(len(scripted.seen), 1)

    def test_managed_session_refuses_runs_on_the_http_adapter(self) -> None:
        """A normalized run carries no lease: the managed node does not call the upstream."""
        scripted = self.managed()
        keys = NodeLeaseKeys(recipient=RECIPIENT, issuer=ISSUER.public_key(), clock_skew_sec=5)
        run = pb.RunRequest(run_id="r1", adapter="up", target="demo-model", input="hi")
        self.session(NODE, keys).envelope_received(pb.Envelope(run_request=run))
        self.http.flush()
        self.clock.advance(0)
        [event] = [e.run_event for e in self.sent if e.HasField("run_event")]
        self.assertEqual((event.run_id, event.type), ("r1", "error"))
        self.assertTrue(event.error.startswith("lease_missing: "), event.error)
        self.assertEqual(error_code(event.metadata), ErrorCode.LEASE_MISSING)
        self.assertEqual(scripted.seen, [])
        self.assertEqual(self.instance.gate.in_use, 0)

    def test_session_node_id_is_the_recipient(self) -> None:
        self.managed()
        keys = NodeLeaseKeys(recipient=RECIPIENT, issuer=ISSUER.public_key(), clock_skew_sec=5)
        request = self.request(
            chat(stream=False),
            profile="openai",
            credential_lease=self.lease(),
            credential_binding=binding(),
        )
        self.session("node-z", keys).envelope_received(pb.Envelope(provider_tunnel_request=request))
        self.assertTrue(self.last().error.startswith("lease_wrong_recipient: "))

    def test_legacy_session(self) -> None:
        self.managed()
        request = self.request(
            chat(stream=False), credential_lease=self.lease(), credential_binding=binding()
        )
        self.session(NODE, None).envelope_received(pb.Envelope(provider_tunnel_request=request))
        self.assertIn("not supported by this node", self.last().error)


def _lost() -> Failure:
    return Failure(ConnectionDone())


class StartupTests(TunnelCase):
    """The node loads its lease keys at startup; a bad file stops it, naming the file."""

    def files(self) -> dict[str, str]:
        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        paths = {
            name: os.path.join(directory, name)
            for name in ("issuer.key", "issuer.pub", "node.key", "node.pub")
        }
        write_issuer(ISSUER, paths["issuer.key"], paths["issuer.pub"])
        write_recipient(RECIPIENT, paths["node.key"], paths["node.pub"])
        return paths

    def daemon_config(self, **security: Any) -> NodeDaemonConfig:
        return NodeDaemonConfig(
            edge_host="127.0.0.1",
            edge_port=17443,
            token=Secret("t"),
            tls=None,
            plaintext=True,
            reconnect=ReconnectPolicy(),
            security=NodeSecurity(**security),
        )

    def test_legacy_loads_nothing(self) -> None:
        self.assertIsNone(node_tap.lease_keys(self.daemon_config()))

    def test_managed_loads_the_keys(self) -> None:
        paths = self.files()
        keys = node_tap.lease_keys(
            self.daemon_config(
                mode="managed",
                recipient_key_file=paths["node.key"],
                issuer_key_file=paths["issuer.pub"],
                clock_skew_sec=2.5,
            )
        )
        assert keys is not None
        self.assertEqual(keys.recipient.key_id, RECIPIENT.key_id)
        self.assertEqual(keys.issuer, ISSUER.public_key())
        self.assertEqual(keys.clock_skew_sec, 2.5)
        self.assertEqual(keys.verifier(NODE).node_id, NODE)
        self.assertIs(keys.verifier(NODE).replay, keys.verifier("other").replay)
        logged = " ".join(formatEvent(e) for e in self.events)
        self.assertIn(RECIPIENT.key_id, logged)

    def test_managed_without_files(self) -> None:
        e = self.assertRaises(
            usage.UsageError, node_tap.lease_keys, self.daemon_config(mode="managed")
        )
        self.assertIn("security.recipient_key_file and security.issuer_key_file", str(e))

    def test_wrong_kind_names_the_file(self) -> None:
        paths = self.files()
        for recipient, issuer, named in [
            (paths["issuer.key"], paths["issuer.pub"], paths["issuer.key"]),
            (paths["node.key"], paths["issuer.key"], paths["issuer.key"]),
            (paths["node.key"], paths["node.pub"], paths["node.pub"]),
            (paths["node.key"] + ".missing", paths["issuer.pub"], paths["node.key"] + ".missing"),
        ]:
            config = self.daemon_config(
                mode="managed", recipient_key_file=recipient, issuer_key_file=issuer
            )
            e = self.assertRaises(usage.UsageError, node_tap.lease_keys, config)
            self.assertIn(named, str(e))

    def test_make_service_refuses_to_start(self) -> None:
        paths = self.files()
        options = node_tap.Options()
        options.node_config = self.daemon_config(
            mode="managed",
            recipient_key_file=paths["issuer.pub"],
            issuer_key_file=paths["issuer.pub"],
        )
        e = self.assertRaises(usage.UsageError, node_tap.makeService, options, MemoryReactorClock())
        self.assertIn(paths["issuer.pub"], str(e))

    def test_make_service_managed(self) -> None:
        paths = self.files()
        options = node_tap.Options()
        options.node_config = self.daemon_config(
            mode="managed",
            recipient_key_file=paths["node.key"],
            issuer_key_file=paths["issuer.pub"],
        )
        node_tap.makeService(options, MemoryReactorClock())


class ProfileDeliveryTests(TunnelCase):
    """The Edge delivers the profile's auth_scheme; the node reads it."""

    def test_payload_and_convert(self) -> None:
        message = _profile_message(
            ProfileConfig(
                name="openai",
                driver="openai_chat",
                auth_header="Authorization",
                auth_scheme="Bearer",
            )
        )
        self.assertEqual((message.auth_header, message.auth_scheme), ("Authorization", "Bearer"))
        profile = runtime_profile(message)
        self.assertEqual((profile.auth_header, profile.auth_scheme), ("Authorization", "Bearer"))


class ArbitraryLeaseTests(ManagedCase):
    """Whatever a managed tunnel carries as a lease, it ends in one ERROR frame, gate empty."""

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.binary(max_size=512),
        st.sampled_from(["", "openai", "other"]),
        st.sampled_from(["demo-model", "other"]),
    )
    def test_arbitrary_lease(self, lease: bytes, profile: str, target: str) -> None:
        scripted = self.managed()
        self.sent.clear()
        self.leased(lease, binding(profile=profile, target=target), profile=profile, target=target)
        [frame] = self.frames()
        self.assertEqual(frame.kind, pb.ERROR)
        code = frame.error.split(":", 1)[0]
        self.assertIn(code, LEASE_ERRORS)
        self.assertEqual(dict(frame.metadata), {ERROR_CODE_KEY: code})
        self.assertEqual(scripted.seen, [])
        self.assertValid()
