# -*- test-case-name: iop.test.config.test_security -*-
"""
Tests for managed-mode configuration: ``security:`` and ``credentials:`` in edge.yaml, the
provider/profile/adapter credential rules, and ``security:`` in node.yaml.

The tables hold one row per rule: a mutation of a known-good config and the issue (path +
message fragment) it must produce.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Mapping
from typing import Any, NamedTuple

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError, load_edge_config, load_node_config, parse_node_config
from iop.config.model import (
    DEFAULT_LEASE_CLOCK_SKEW_SEC,
    DEFAULT_LEASE_TTL_SEC,
    DEFAULT_TRUST_DOMAIN,
    EdgeConfig,
    EdgeSecurity,
    NodeDaemonConfig,
    NodeSecurity,
    Secret,
)
from iop.test.config import test_edge_config as edge_tests
from iop.test.config import test_node_config as node_tests
from iop.test.config.test_edge_config import (
    EdgeConfigTestMixin,
    Mutation,
    append,
    assertIssue,
    chain,
    drop,
    put,
)

OPENAI_KEY = "sk-openai-secret-value"
ANTHROPIC_KEY = "anthropic-secret-value"
ENVIRON = {
    **edge_tests.ENVIRON,
    "OPENAI_API_KEY": OPENAI_KEY,
    "NEWLINE_KEY": "sk-abc\r\nX-Injected: 1",
    "SCHEMED_KEY": "bearer sk-pasted-with-its-scheme",
}
MANAGED = "security.mode: managed"


def managed_edge() -> dict[str, Any]:
    """The edge tests' base config, made managed: every rule satisfied."""
    data = edge_tests.base_config()
    data["security"] = {"mode": "managed", "lease": {"signing_key_file": "keys/issuer.key"}}
    data["node_transport"]["tls"]["client_ca_file"] = "pki/ca.crt"
    data["credentials"] = [
        {"name": "openai-main", "secret": "${OPENAI_API_KEY}"},
        {"name": "anthropic.main_2", "secret_file": "secrets/anthropic.key", "revision": 3},
    ]
    node_a, node_b = data["nodes"]
    node_a["recipient_key_file"] = "keys/node-a.recipient.pub"
    node_b["recipient_key_file"] = "keys/node-b.recipient.pub"
    # Managed: the credential comes from the slot, not from the adapter's headers.
    node_a["adapters"][0]["headers"] = {"X-Trace": "on"}
    node_a["providers"][0]["credential"] = "openai-main"
    return data


class ManagedEdgeMixin(EdgeConfigTestMixin):
    def make_managed_base(self, case: SynchronousTestCase) -> None:
        self.make_base(case)
        os.makedirs(os.path.join(self.base, "keys"))
        for name in ("issuer.key", "node-a.recipient.pub", "node-b.recipient.pub"):
            self.write(os.path.join("keys", name), "KEY\n")
        self.write(os.path.join("secrets", "anthropic.key"), f"\n {ANTHROPIC_KEY} \n")

    def parse(self, data: object, environ: Mapping[str, str] = ENVIRON) -> EdgeConfig:
        return super().parse(data, environ)


class ManagedEdgeTests(ManagedEdgeMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_managed_base(self)

    def test_managed(self) -> None:
        config = self.parse(managed_edge())
        key = os.path.join(self.base, "keys")
        self.assertEqual(
            config.security,
            EdgeSecurity(
                mode="managed",
                trust_domain=DEFAULT_TRUST_DOMAIN,
                signing_key_file=os.path.join(key, "issuer.key"),
                lease_ttl_sec=DEFAULT_LEASE_TTL_SEC,
            ),
        )
        self.assertTrue(config.security.managed)
        self.assertEqual(config.security.node_workload("node-a"), "node-a.node.iop.internal")
        assert config.tls is not None
        self.assertEqual(config.tls.client_ca_file, os.path.join(self.base, "pki", "ca.crt"))
        openai, anthropic = config.credentials
        self.assertEqual((openai.name, openai.revision, openai.enabled), ("openai-main", 1, True))
        self.assertIsInstance(openai.secret, Secret)
        self.assertEqual(openai.secret.reveal(), OPENAI_KEY)
        self.assertEqual(
            (anthropic.name, anthropic.secret.reveal(), anthropic.revision),
            ("anthropic.main_2", ANTHROPIC_KEY, 3),
        )
        node_a, node_b = config.nodes
        self.assertEqual(node_a.recipient_key_file, os.path.join(key, "node-a.recipient.pub"))
        self.assertEqual(node_b.recipient_key_file, os.path.join(key, "node-b.recipient.pub"))
        self.assertEqual(node_a.providers[0].credential, "openai-main")
        self.assertEqual(node_a.providers[1].credential, "")
        self.assertEqual(config.protocol_profiles[0].auth_scheme, "Bearer")
        self.assertIs(config.credential("openai-main"), openai)
        self.assertIs(config.credential("anthropic.main_2"), anthropic)
        self.assertIsNone(config.credential("nope"))

    def test_scheme_in_secret_other_profile(self) -> None:
        """A secret starting with a word is fine where the profile adds no scheme."""
        data = managed_edge()
        data["credentials"][0]["secret"] = "${SCHEMED_KEY}"
        data["protocol_profiles"][0]["auth_header"] = "x-api-key"
        slot = self.parse(data).credentials[0]
        self.assertEqual(slot.secret.reveal(), ENVIRON["SCHEMED_KEY"])

    def test_every_option(self) -> None:
        data = managed_edge()
        data["security"].update(
            trust_domain="gpu.corp-1.example",
            lease={
                "signing_key_file": "keys/issuer.key",
                "ttl_sec": 300,
            },
        )
        data["credentials"][0].update(revision=7, enabled=False)
        data["protocol_profiles"][0]["auth_scheme"] = "Token"
        config = self.parse(data)
        self.assertEqual(config.security.trust_domain, "gpu.corp-1.example")
        self.assertEqual(config.security.node_workload("node-b"), "node-b.node.gpu.corp-1.example")
        self.assertEqual(config.security.lease_ttl_sec, 300.0)
        slot = config.credentials[0]
        self.assertEqual((slot.revision, slot.enabled), (7, False))
        self.assertEqual(config.protocol_profiles[0].auth_scheme, "Token")

    def test_provider_without_credential(self) -> None:
        """A managed provider may name no slot (a local vLLM): it simply gets no auth header."""
        data = managed_edge()
        data["nodes"][0]["adapters"][0].update(type="vllm", headers={})
        del data["nodes"][0]["providers"][0]["credential"]
        config = self.parse(data)
        self.assertEqual([p.credential for p in config.nodes[0].providers], ["", ""])

    def test_slot_without_provider(self) -> None:
        """A slot nobody names is allowed (staged for a provider to come)."""
        data = managed_edge()
        del data["nodes"][0]["providers"][0]["credential"]
        self.assertEqual(len(self.parse(data).credentials), 2)

    def test_vllm_tunnel_with_credential(self) -> None:
        data = managed_edge()
        data["nodes"][0]["adapters"][0]["type"] = "vllm"
        provider = self.parse(data).nodes[0].providers[0]
        self.assertEqual((provider.type, provider.credential), ("vllm", "openai-main"))

    def test_other_headers_kept(self) -> None:
        """Headers that carry no credential still go to the adapter in managed mode."""
        config = self.parse(managed_edge())
        self.assertEqual(config.nodes[0].adapters[0].headers, (("X-Trace", "on"),))

    def test_ttl_bounds(self) -> None:
        for ttl in (0.5, 1, 299.5, 300):
            data = managed_edge()
            data["security"]["lease"]["ttl_sec"] = ttl
            self.assertEqual(self.parse(data).security.lease_ttl_sec, float(ttl))

    def test_empty_credentials_list(self) -> None:
        data = managed_edge()
        data["credentials"] = []
        del data["nodes"][0]["providers"][0]["credential"]
        self.assertEqual(self.parse(data).credentials, ())


class LegacyEdgeTests(ManagedEdgeMixin, SynchronousTestCase):
    """What parses today parses the same: legacy is the default and managed keys are optional."""

    def setUp(self) -> None:
        self.make_managed_base(self)

    def test_defaults(self) -> None:
        config = self.parse(edge_tests.base_config())
        self.assertEqual(config.security, EdgeSecurity())
        self.assertEqual(config.security.mode, "legacy")
        self.assertFalse(config.security.managed)
        self.assertEqual(config.security.trust_domain, DEFAULT_TRUST_DOMAIN)
        self.assertIsNone(config.security.signing_key_file)
        self.assertEqual(config.security.lease_ttl_sec, 30.0)
        self.assertEqual(config.credentials, ())
        self.assertEqual([n.recipient_key_file for n in config.nodes], [None, None])
        self.assertEqual([p.credential for n in config.nodes for p in n.providers], ["", "", ""])
        # The adapter keeps its own credential header in legacy mode.
        self.assertEqual(
            config.nodes[0].adapters[0].headers, (("Authorization", "Bearer upstream-key-value"),)
        )

    def test_explicit_legacy(self) -> None:
        """Managed-mode settings may be written ahead in legacy mode; nothing requires them."""
        data = edge_tests.base_config()
        data["security"] = {
            "mode": "legacy",
            "trust_domain": "corp.example",
            "lease": {"signing_key_file": "keys/issuer.key", "ttl_sec": 10},
        }
        data["nodes"][0]["recipient_key_file"] = "keys/node-a.recipient.pub"
        config = self.parse(data)
        self.assertEqual(config.security.mode, "legacy")
        self.assertEqual(config.security.trust_domain, "corp.example")
        self.assertEqual(config.security.lease_ttl_sec, 10.0)
        self.assertEqual(
            config.nodes[0].recipient_key_file,
            os.path.join(self.base, "keys", "node-a.recipient.pub"),
        )

    def test_plaintext_still_allowed(self) -> None:
        data = edge_tests.base_config()
        data["listen"]["nodes"] = "tcp:7443:interface=127.0.0.1"
        data["node_transport"] = {"plaintext": True}
        data["security"] = {"mode": "legacy"}
        self.assertTrue(self.parse(data).plaintext_nodes)

    def test_empty_catalog(self) -> None:
        """An empty ``credentials: []`` holds no secret: accepted in legacy mode."""
        data = edge_tests.base_config()
        data["credentials"] = []
        self.assertEqual(self.parse(data).credentials, ())

    def test_auth_scheme_default(self) -> None:
        """``Bearer`` for Authorization in any case, none for other headers, unless given."""
        cases: list[tuple[dict[str, Any], str]] = [
            ({"auth_header": "Authorization"}, "Bearer"),
            ({"auth_header": "AUTHORIZATION"}, "Bearer"),
            ({"auth_header": "authorization"}, "Bearer"),
            ({"auth_header": "x-api-key"}, ""),
            ({}, ""),
            ({"auth_header": "Authorization", "auth_scheme": ""}, ""),
            ({"auth_header": "Authorization", "auth_scheme": "Token"}, "Token"),
            ({"auth_header": "X-Key", "auth_scheme": "Key"}, "Key"),
        ]
        for fields, expected in cases:
            data = edge_tests.base_config()
            profile = data["protocol_profiles"][0]
            del profile["auth_header"]
            profile.update(fields)
            self.assertEqual(
                self.parse(data).protocol_profiles[0].auth_scheme, expected, str(fields)
            )


class Row(NamedTuple):
    name: str
    mutate: Mutation
    path: str
    fragment: str


def _pair(name: str, secret: str = "${OPENAI_API_KEY}") -> dict[str, Any]:
    return {"name": name, "secret": secret}


_P0 = "nodes.0.providers.0"
_CREDENTIAL = "nodes[0].providers[0].credential"

EDGE_ROWS = [
    # security
    Row("mode", put("security.mode", "strict"), "security.mode", "must be one of"),
    Row("modeType", put("security.mode", True), "security.mode", "must be a string"),
    Row("securityType", put("security", "managed"), "security", "must be a mapping"),
    Row("securityUnknown", put("security.modes", "x"), "security.modes", "unknown key"),
    Row(
        "trustDomainCase",
        put("security.trust_domain", "IOP.internal"),
        "security.trust_domain",
        "write 'iop.internal'",
    ),
    Row(
        "trustDomainLabel",
        put("security.trust_domain", "-iop.internal"),
        "security.trust_domain",
        "must be a DNS name",
    ),
    Row(
        "trustDomainEmptyLabel",
        put("security.trust_domain", "iop..internal"),
        "security.trust_domain",
        "must be a DNS name",
    ),
    Row(
        "trustDomainTrailingDot",
        put("security.trust_domain", "iop.internal."),
        "security.trust_domain",
        "must be a DNS name",
    ),
    Row(
        "trustDomainUnderscore",
        put("security.trust_domain", "iop_internal"),
        "security.trust_domain",
        "must be a DNS name",
    ),
    Row(
        "trustDomainLong",
        put("security.trust_domain", ".".join(["a" * 63] * 4)),
        "security.trust_domain",
        "at most 253 characters",
    ),
    Row("trustDomainEmpty", put("security.trust_domain", ""), "security.trust_domain", "empty"),
    Row(
        "signingKeyMissing",
        drop("security.lease.signing_key_file"),
        "security.lease.signing_key_file",
        f"is required with {MANAGED}",
    ),
    Row(
        "leaseMissing",
        drop("security.lease"),
        "security.lease.signing_key_file",
        "`iop keys issuer`",
    ),
    Row(
        "signingKeyAbsent",
        put("security.lease.signing_key_file", "keys/nope.key"),
        "security.lease.signing_key_file",
        "keys/nope.key does not exist",
    ),
    Row(
        "signingKeyDirectory",
        put("security.lease.signing_key_file", "keys"),
        "security.lease.signing_key_file",
        "is not a regular file",
    ),
    Row(
        "signingKeyEmpty",
        put("security.lease.signing_key_file", " "),
        "security.lease.signing_key_file",
        "must not be empty",
    ),
    Row("ttlZero", put("security.lease.ttl_sec", 0), "security.lease.ttl_sec", "must be > 0"),
    Row("ttlNegative", put("security.lease.ttl_sec", -5), "security.lease.ttl_sec", "must be > 0"),
    Row(
        "ttlTooLong",
        put("security.lease.ttl_sec", 300.5),
        "security.lease.ttl_sec",
        "must be <= 300",
    ),
    Row("ttlType", put("security.lease.ttl_sec", "30s"), "security.lease.ttl_sec", "number"),
    Row("leaseUnknown", put("security.lease.ttl", 30), "security.lease.ttl", "did you mean"),
    # node transport
    Row(
        "plaintext",
        chain(
            put("listen.nodes", "tcp:7443:interface=127.0.0.1"),
            put("node_transport", {"plaintext": True}),
        ),
        "node_transport.plaintext",
        "plaintext node connections are refused",
    ),
    Row(
        "clientCaMissing",
        drop("node_transport.tls.client_ca_file"),
        "node_transport.tls.client_ca_file",
        f"is required with {MANAGED}",
    ),
    Row(
        "clientCaAbsent",
        put("node_transport.tls.client_ca_file", "pki/other-ca.crt"),
        "node_transport.tls.client_ca_file",
        "pki/other-ca.crt does not exist",
    ),
    Row(
        "tlsMissing",
        drop("node_transport.tls"),
        "node_transport.tls",
        "is required unless node_transport.plaintext is true",
    ),
    # nodes
    Row(
        "recipientMissing",
        drop("nodes.1.recipient_key_file"),
        "nodes[1].recipient_key_file",
        "`iop keys recipient node-b`",
    ),
    Row(
        "recipientAbsent",
        put("nodes.0.recipient_key_file", "keys/gone.pub"),
        "nodes[0].recipient_key_file",
        "keys/gone.pub does not exist",
    ),
    Row(
        "recipientType",
        put("nodes.0.recipient_key_file", 3),
        "nodes[0].recipient_key_file",
        "must be a string",
    ),
    Row(
        "nodeIdUppercase",
        put("nodes.0.id", "Node-A"),
        "nodes[0].id",
        "part of its certificate's DNS name (<id>.node.iop.internal)",
    ),
    Row("nodeIdUnderscore", put("nodes.0.id", "node_a"), "nodes[0].id", "DNS name"),
    Row("nodeIdDash", put("nodes.0.id", "node-a-"), "nodes[0].id", "DNS name"),
    # credentials catalog
    Row("catalogType", put("credentials", {"a": "b"}), "credentials", "must be a list"),
    Row("slotType", put("credentials.0", "openai-main"), "credentials[0]", "must be a mapping"),
    Row("slotName", drop("credentials.0.name"), "credentials[0].name", "is required"),
    Row(
        "slotNameCase",
        put("credentials.1.name", "Anthropic"),
        "credentials[1].name",
        "lowercase letters, digits, '.', '_' and '-'",
    ),
    Row(
        "slotNameStart",
        put("credentials.1.name", "-x"),
        "credentials[1].name",
        "must start with a lowercase letter or digit",
    ),
    Row("slotNameSpace", put("credentials.1.name", "a b"), "credentials[1].name", "lowercase"),
    Row(
        "slotDuplicate",
        append("credentials", _pair("openai-main")),
        "credentials[2].name",
        "duplicate credential slot 'openai-main' (also credentials[0])",
    ),
    Row(
        "secretNone",
        drop("credentials.0.secret"),
        "credentials[0]",
        "one of secret or secret_file is required",
    ),
    Row(
        "secretBoth",
        put("credentials.0.secret_file", "secrets/anthropic.key"),
        "credentials[0]",
        "set only one of secret or secret_file (found: secret, secret_file)",
    ),
    Row(
        "secretLiteral",
        put("credentials.0.secret", "sk-literal"),
        "credentials[0].secret",
        "literal secrets are not allowed in config; use secret: ${ENV_VAR} or secret_file",
    ),
    Row(
        "secretInterpolated",
        put("credentials.0.secret", "Bearer ${OPENAI_API_KEY}"),
        "credentials[0].secret",
        "literal secrets are not allowed",
    ),
    Row(
        "secretUnset",
        put("credentials.0.secret", "${NO_SUCH_KEY}"),
        "credentials[0].secret",
        "environment variable NO_SUCH_KEY is not set",
    ),
    Row(
        "secretEmpty",
        put("credentials.0.secret", "${EMPTY}"),
        "credentials[0].secret",
        "environment variable EMPTY is empty",
    ),
    Row(
        "secretType",
        put("credentials.0.secret", 12),
        "credentials[0].secret",
        "must be a ${ENV_VAR} reference string, got integer",
    ),
    Row(
        "secretLineBreak",
        put("credentials.0.secret", "${NEWLINE_KEY}"),
        "credentials[0].secret",
        "control character",
    ),
    Row(
        "secretFileAbsent",
        put("credentials.1.secret_file", "secrets/nope.key"),
        "credentials[1].secret_file",
        "secret file",
    ),
    Row(
        "secretFileEmptyPath",
        put("credentials.1.secret_file", ""),
        "credentials[1].secret_file",
        "must be a file path, got empty",
    ),
    Row("revisionZero", put("credentials.0.revision", 0), "credentials[0].revision", ">= 1"),
    Row(
        "revisionType",
        put("credentials.0.revision", "2"),
        "credentials[0].revision",
        "must be an integer",
    ),
    Row(
        "revisionHuge",
        put("credentials.0.revision", 2**64),
        "credentials[0].revision",
        "must be <=",
    ),
    Row(
        "enabledType",
        put("credentials.0.enabled", "yes"),
        "credentials[0].enabled",
        "must be a boolean",
    ),
    Row(
        "slotUnknownKey",
        put("credentials.0.secrets", "x"),
        "credentials[0].secrets",
        "did you mean 'secret'",
    ),
    # providers[].credential
    Row(
        "unknownSlot",
        put(f"{_P0}.credential", "nope"),
        _CREDENTIAL,
        "unknown credential slot 'nope' (credentials defines: anthropic.main_2, openai-main)",
    ),
    Row(
        "unknownSlotNoCatalog",
        drop("credentials"),
        _CREDENTIAL,
        "unknown credential slot 'openai-main' (credentials defines: none)",
    ),
    Row("credentialEmpty", put(f"{_P0}.credential", ""), _CREDENTIAL, "must not be empty"),
    Row("credentialType", put(f"{_P0}.credential", ["a"]), _CREDENTIAL, "must be a string"),
    Row(
        "credentialNoProfile",
        drop(f"{_P0}.profile"),
        _CREDENTIAL,
        "needs the provider's `profile`",
    ),
    Row(
        "profileNoAuthHeader",
        drop("protocol_profiles.0.auth_header"),
        _CREDENTIAL,
        "profile 'openai-chat' (protocol_profiles[0]) has no auth_header to carry the credential",
    ),
    Row(
        "credentialOnRun",
        chain(
            put("nodes.1.providers.0.credential", "openai-main"),
            put("nodes.1.providers.0.profile", "openai-chat"),
        ),
        "nodes[1].providers[0].credential",
        "ollama providers serve normalized runs, which carry no credential",
    ),
    Row(
        "credentialOnCli",
        chain(
            put("nodes.0.providers.1.credential", "openai-main"),
            put("nodes.0.providers.1.profile", "openai-chat"),
        ),
        "nodes[0].providers[1].credential",
        "cli providers serve normalized runs",
    ),
    Row(
        "secretWithScheme",
        put("credentials.0.secret", "${SCHEMED_KEY}"),
        _CREDENTIAL,
        "the secret of credential slot 'openai-main' starts with 'Bearer': give the bare key",
    ),
    Row(
        "credentialOnDisabled",
        chain(put(f"{_P0}.enabled", False), put(f"{_P0}.credential", "gone")),
        _CREDENTIAL,
        "unknown credential slot 'gone'",
    ),
    # adapter headers
    Row(
        "boundHeader",
        put("nodes.0.adapters.0.headers", {"Authorization": "Bearer ${UPSTREAM_KEY}"}),
        "nodes[0].adapters[0].headers.Authorization",
        "provider 'a-chat' gets this header from credential slot 'openai-main'",
    ),
    Row(
        "boundHeaderCase",
        put("nodes.0.adapters.0.headers", {"aUTHORIZATION": "x"}),
        "nodes[0].adapters[0].headers.aUTHORIZATION",
        "an adapter's headers must not carry a credential",
    ),
    Row(
        "boundCustomHeader",
        chain(
            put("protocol_profiles.0.auth_header", "X-Upstream-Auth"),
            put("nodes.0.adapters.0.headers", {"x-upstream-auth": "x"}),
        ),
        "nodes[0].adapters[0].headers.x-upstream-auth",
        "gets this header from credential slot 'openai-main'",
    ),
    Row(
        "credentialHeaderUnbound",
        put("nodes.1.adapters.ollama.headers", {"X-Api-Key": "${UPSTREAM_KEY}"}),
        "nodes[1].adapters.ollama.headers.X-Api-Key",
        "an adapter's headers must not carry a credential with security.mode: managed",
    ),
    Row(
        "profileHeaderUnbound",
        chain(
            put("protocol_profiles.0.auth_header", "X-Upstream-Auth"),
            put("nodes.0.adapters.1.headers", {"X-Upstream-Auth": "x"}),
        ),
        "nodes[0].adapters[1].headers.X-Upstream-Auth",
        "put the key in credentials[]",
    ),
    Row(
        "googleKeyHeader",
        put("nodes.0.adapters.0.headers", {"x-goog-api-key": "x"}),
        "nodes[0].adapters[0].headers.x-goog-api-key",
        "must not carry a credential",
    ),
    Row(
        "proxyAuthorization",
        put("nodes.0.adapters.0.headers", {"Proxy-Authorization": "x"}),
        "nodes[0].adapters[0].headers.Proxy-Authorization",
        "must not carry a credential",
    ),
    # protocol_profiles[].auth_scheme
    Row(
        "schemeWithoutHeader",
        chain(
            drop("protocol_profiles.0.auth_header"),
            put("protocol_profiles.0.auth_scheme", "Bearer"),
        ),
        "protocol_profiles[0].auth_scheme",
        "needs auth_header",
    ),
    Row(
        "schemeNotToken",
        put("protocol_profiles.0.auth_scheme", "Bear er"),
        "protocol_profiles[0].auth_scheme",
        "must be an HTTP auth scheme token",
    ),
    Row(
        "schemeType",
        put("protocol_profiles.0.auth_scheme", 1),
        "protocol_profiles[0].auth_scheme",
        "must be a string",
    ),
]

# Rows on a legacy config (the edge tests' base, plus what the row adds).
LEGACY_ROWS = [
    Row(
        "providerCredential",
        chain(
            put("credentials", [_pair("openai-main")]),
            put(f"{_P0}.credential", "openai-main"),
        ),
        _CREDENTIAL,
        f"credentials need {MANAGED}",
    ),
    Row(
        "providerCredentialNoCatalog",
        put(f"{_P0}.credential", "openai-main"),
        _CREDENTIAL,
        f"credentials need {MANAGED}",
    ),
    Row(
        "catalog",
        put("credentials", [_pair("openai-main")]),
        "credentials",
        f"credentials need {MANAGED}: in legacy mode no lease carries them",
    ),
    Row(
        "catalogExplicitLegacy",
        chain(put("security", {"mode": "legacy"}), put("credentials", [_pair("a")])),
        "credentials",
        f"credentials need {MANAGED}",
    ),
    Row(
        "catalogStillValidated",
        put("credentials", [_pair("openai-main", "sk-literal")]),
        "credentials[0].secret",
        "literal secrets are not allowed",
    ),
    Row(
        "trustDomainChecked",
        put("security", {"trust_domain": "Corp"}),
        "security.trust_domain",
        "write 'corp'",
    ),
    Row(
        "leaseFileChecked",
        put("security", {"lease": {"signing_key_file": "keys/nope.key"}}),
        "security.lease.signing_key_file",
        "does not exist",
    ),
    Row(
        "ttlChecked",
        put("security", {"lease": {"ttl_sec": 301}}),
        "security.lease.ttl_sec",
        "must be <= 300",
    ),
]


class EdgeValidationTableTests(ManagedEdgeMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_managed_base(self)

    def check(self, rows: list[Row], base: dict[str, Any]) -> None:
        for row in rows:
            data = copy.deepcopy(base)
            row.mutate(data)
            try:
                self.parse(data)
            except ConfigError as error:
                assertIssue(self, error, row.path, row.fragment)
            else:
                self.fail(f"row {row.name}: no ConfigError")

    def test_managed_rows(self) -> None:
        self.check(EDGE_ROWS, managed_edge())

    def test_legacy_rows(self) -> None:
        self.check(LEGACY_ROWS, edge_tests.base_config())

    def test_row_names_unique(self) -> None:
        names = [row.name for row in EDGE_ROWS + LEGACY_ROWS]
        self.assertEqual(len(names), len(set(names)))

    def test_bound_header_one_issue(self) -> None:
        """A bound credential header is reported once, with the provider that owns it."""
        data = managed_edge()
        data["nodes"][0]["adapters"][0]["headers"] = {"Authorization": "Bearer ${UPSTREAM_KEY}"}
        error = self.assertRaises(ConfigError, self.parse, data)
        self.assertEqual(
            [i.path for i in error.issues], ["nodes[0].adapters[0].headers.Authorization"]
        )

    def test_managed_names_what_is_missing(self) -> None:
        """A legacy config switched to managed lists every missing piece, one issue each."""
        data = edge_tests.base_config()
        data["security"] = {"mode": "managed"}
        error = self.assertRaises(ConfigError, self.parse, data)
        self.assertEqual(
            [i.path for i in error.issues],
            [
                "security.lease.signing_key_file",
                "node_transport.tls.client_ca_file",
                "nodes[0].recipient_key_file",
                "nodes[0].adapters[0].headers.Authorization",
                "nodes[1].recipient_key_file",
            ],
        )
        for issue in error.issues:
            self.assertIn(MANAGED, issue.message)

    def test_no_cascades(self) -> None:
        """A mode or trust domain that cannot be read is reported alone, not guessed at."""
        cases: list[tuple[Mutation, list[str]]] = [
            (put("security.mode", "strict"), ["security.mode"]),
            (put("security.mode", 1), ["security.mode"]),
            (put("security", "managed"), ["security"]),
            (put("security.trust_domain", "Corp"), ["security.trust_domain"]),
            (put("security.trust_domain", 7), ["security.trust_domain"]),
        ]
        for mutate, paths in cases:
            data = managed_edge()
            mutate(data)
            error = self.assertRaises(ConfigError, self.parse, data)
            self.assertEqual([i.path for i in error.issues], paths, str(error))

    def test_unreadable_catalog_no_cascade(self) -> None:
        """A catalog that cannot be read does not also fail every slot reference."""
        for broken in ("x", [{"secret": "${OPENAI_API_KEY}"}], ["openai-main"]):
            data = managed_edge()
            data["credentials"] = broken
            error = self.assertRaises(ConfigError, self.parse, data)
            self.assertNotIn(_CREDENTIAL, [i.path for i in error.issues], str(error))

    def test_unreadable_file(self) -> None:
        if os.getuid() == 0:
            raise self.skipTest("root reads every file")
        os.chmod(os.path.join(self.base, "keys", "issuer.key"), 0)
        error = self.assertRaises(ConfigError, self.parse, managed_edge())
        assertIssue(self, error, "security.lease.signing_key_file", "is not readable")


class SecretHygieneTests(ManagedEdgeMixin, SynchronousTestCase):
    """A credential's secret never appears in a repr, a str or a ConfigError."""

    SECRET = "S3CRET-credential-9d2e"

    def setUp(self) -> None:
        self.make_managed_base(self)

    def test_not_in_repr(self) -> None:
        self.write(os.path.join("secrets", "anthropic.key"), self.SECRET + "-file")
        environ = {**ENVIRON, "OPENAI_API_KEY": self.SECRET + "-env"}
        config = self.parse(managed_edge(), environ)
        self.assertEqual(config.credentials[0].secret.reveal(), self.SECRET + "-env")
        self.assertEqual(config.credentials[1].secret.reveal(), self.SECRET + "-file")
        texts = [repr(config), str(config), *(repr(c) for c in config.credentials)]
        for text in texts:
            self.assertNotIn(self.SECRET, text)

    def test_not_in_errors(self) -> None:
        data = managed_edge()
        data["credentials"] = [
            _pair("literal", self.SECRET),
            _pair("interpolated", f"{self.SECRET}${{OPENAI_API_KEY}}"),
            _pair("newline", "${BROKEN}"),
            {"name": "listed", "secret": [self.SECRET]},
            {"name": "both", "secret": self.SECRET, "secret_file": self.SECRET},
            {"name": "file", "secret_file": "secrets/secret.key", "revision": self.SECRET},
            {"name": self.SECRET.lower() + " x", "secret": "${OPENAI_API_KEY}"},
        ]
        self.write(os.path.join("secrets", "secret.key"), self.SECRET)
        environ = {**ENVIRON, "BROKEN": f"{self.SECRET}\nX-Injected: 1"}
        error = self.assertRaises(ConfigError, self.parse, data, environ)
        self.assertGreaterEqual(len(error.issues), 6, str(error))
        self.check_clean(error)

    def test_scheme_check_not_in_errors(self) -> None:
        data = managed_edge()
        environ = {**ENVIRON, "OPENAI_API_KEY": f"Bearer {self.SECRET}"}
        error = self.assertRaises(ConfigError, self.parse, data, environ)
        assertIssue(self, error, _CREDENTIAL, "starts with 'Bearer'")
        self.check_clean(error)

    def check_clean(self, error: ConfigError) -> None:
        for text in (str(error), repr(error), *(str(i) for i in error.issues)):
            self.assertNotIn(self.SECRET, text)
            self.assertNotIn(OPENAI_KEY, text)


# ---------------------------------------------------------------------------------------------
# node.yaml


def managed_node() -> dict[str, Any]:
    data = node_tests.base_config()
    data["edge"].update(cert_file="pki/node.crt", key_file="pki/node.key")
    data["security"] = {
        "mode": "managed",
        "recipient_key_file": "keys/node.recipient.key",
        "issuer_key_file": "keys/issuer.pub",
    }
    return data


class NodeSecurityTestCase(node_tests.NodeConfigTestCase):
    def setUp(self) -> None:
        super().setUp()
        os.makedirs(os.path.join(self.base, "keys"))
        for name in ("node.recipient.key", "issuer.pub"):
            self.write(os.path.join("keys", name), "KEY\n")


class NodeSecurityTests(NodeSecurityTestCase):
    def test_managed(self) -> None:
        config = self.parse(managed_node())
        keys = os.path.join(self.base, "keys")
        self.assertEqual(
            config.security,
            NodeSecurity(
                mode="managed",
                recipient_key_file=os.path.join(keys, "node.recipient.key"),
                issuer_key_file=os.path.join(keys, "issuer.pub"),
                clock_skew_sec=DEFAULT_LEASE_CLOCK_SKEW_SEC,
            ),
        )
        self.assertTrue(config.security.managed)
        assert config.tls is not None
        self.assertEqual(config.tls.cert_file, os.path.join(self.base, "pki", "node.crt"))

    def test_clock_skew_bounds(self) -> None:
        for skew in (0, 0.5, 5, 60):
            data = managed_node()
            data["security"]["clock_skew_sec"] = skew
            self.assertEqual(self.parse(data).security.clock_skew_sec, float(skew))

    def test_defaults(self) -> None:
        config = self.parse(node_tests.base_config())
        self.assertEqual(config.security, NodeSecurity())
        self.assertFalse(config.security.managed)
        self.assertEqual(config.security.clock_skew_sec, 5.0)

    def test_legacy_with_keys(self) -> None:
        """Key files may be written ahead in legacy mode (checked, not required)."""
        data = node_tests.base_config()
        data["security"] = {"recipient_key_file": "keys/node.recipient.key"}
        config = self.parse(data)
        self.assertEqual(config.security.mode, "legacy")
        self.assertEqual(
            config.security.recipient_key_file,
            os.path.join(self.base, "keys", "node.recipient.key"),
        )
        self.assertIsNone(config.security.issuer_key_file)

    def test_legacy_plaintext(self) -> None:
        data: dict[str, Any] = {
            "edge": {"host": "127.0.0.1", "port": 7443, "plaintext": True},
            "token_file": "node.token",
            "security": {"mode": "legacy"},
        }
        self.assertTrue(self.parse(data).plaintext)

    def test_not_in_repr(self) -> None:
        config: NodeDaemonConfig = self.parse(managed_node())
        self.assertNotIn(node_tests.NODE_TOKEN, repr(config))


NODE_ROWS = [
    Row("mode", put("security.mode", "on"), "security.mode", "must be one of"),
    Row("type", put("security", []), "security", "must be a mapping"),
    Row("unknown", put("security.issuer_key", "x"), "security.issuer_key", "did you mean"),
    Row(
        "plaintext",
        chain(
            put("edge", {"host": "127.0.0.1", "port": 7443, "plaintext": True}),
        ),
        "edge.plaintext",
        f"plaintext is refused with {MANAGED}",
    ),
    Row(
        "certMissing",
        chain(drop("edge.cert_file"), drop("edge.key_file")),
        "edge.cert_file",
        f"is required with {MANAGED}: the node's client certificate",
    ),
    Row(
        "keyMissing",
        chain(drop("edge.cert_file"), drop("edge.key_file")),
        "edge.key_file",
        "`iop pki issue-node NODE_ID`",
    ),
    Row(
        "keyAlone",
        drop("edge.key_file"),
        "edge.key_file",
        "cert_file and key_file must be given together",
    ),
    Row(
        "certAbsent",
        put("edge.cert_file", "pki/gone.crt"),
        "edge.cert_file",
        "pki/gone.crt does not exist",
    ),
    Row(
        "recipientMissing",
        drop("security.recipient_key_file"),
        "security.recipient_key_file",
        f"is required with {MANAGED}: this node's lease recipient private key",
    ),
    Row(
        "recipientAbsent",
        put("security.recipient_key_file", "keys/gone.key"),
        "security.recipient_key_file",
        "keys/gone.key does not exist",
    ),
    Row(
        "recipientDirectory",
        put("security.recipient_key_file", "keys"),
        "security.recipient_key_file",
        "is not a regular file",
    ),
    Row(
        "issuerMissing",
        drop("security.issuer_key_file"),
        "security.issuer_key_file",
        "the Edge's lease-issuer public key",
    ),
    Row(
        "issuerAbsent",
        put("security.issuer_key_file", "keys/gone.pub"),
        "security.issuer_key_file",
        "does not exist",
    ),
    Row(
        "issuerEmpty",
        put("security.issuer_key_file", ""),
        "security.issuer_key_file",
        "must not be empty",
    ),
    Row(
        "skewNegative",
        put("security.clock_skew_sec", -1),
        "security.clock_skew_sec",
        "must be >= 0",
    ),
    Row(
        "skewTooLarge",
        put("security.clock_skew_sec", 60.5),
        "security.clock_skew_sec",
        "must be <= 60",
    ),
    Row("skewType", put("security.clock_skew_sec", "5s"), "security.clock_skew_sec", "number"),
]


class NodeValidationTableTests(NodeSecurityTestCase):
    def test_rows(self) -> None:
        names = [row.name for row in NODE_ROWS]
        self.assertEqual(len(names), len(set(names)))
        for row in NODE_ROWS:
            data = managed_node()
            row.mutate(data)
            try:
                parse_node_config(data, base_dir=self.base, environ=node_tests.ENVIRON)
            except ConfigError as error:
                assertIssue(self, error, row.path, row.fragment)
            else:
                self.fail(f"row {row.name}: no ConfigError")

    def test_managed_names_what_is_missing(self) -> None:
        data = node_tests.base_config()
        data["security"] = {"mode": "managed"}
        error = self.fails(data)
        self.assertEqual(
            [i.path for i in error.issues],
            [
                "security.recipient_key_file",
                "security.issuer_key_file",
                "edge.cert_file",
                "edge.key_file",
            ],
        )
        for issue in error.issues:
            self.assertIn(MANAGED, issue.message)


class ExampleFileTests(ManagedEdgeMixin, SynchronousTestCase):
    """The documented examples stay in legacy mode, with the managed parts commented out."""

    def setUp(self) -> None:
        self.make_managed_base(self)

    def test_edge_example(self) -> None:
        example = os.path.join(edge_tests.EXAMPLE_DIR, "edge.yaml")
        if not os.path.exists(example):
            raise self.skipTest("etc/iop/edge.yaml is not in this tree")
        shutil.copy(example, os.path.join(self.base, "edge.yaml"))
        self.write("secrets/build-c.token", "token-build-c\n")
        # The example names the files `iop pki issue-edge edge.iop.internal` writes.
        for name in ("edge.iop.internal.crt", "edge.iop.internal.key"):
            self.write(os.path.join("pki", name), "PEM\n")
        environ = {
            "IOP_NODE_GPU_A_TOKEN": "a",
            "IOP_VLLM_API_KEY": "b",
            "IOP_AGENT_API_KEY": "c",
            "IOP_UPSTREAM_KEY": "d",
        }
        config = load_edge_config(os.path.join(self.base, "edge.yaml"), environ)
        self.assertEqual(config.security, EdgeSecurity())
        self.assertEqual(config.credentials, ())
        self.assertEqual(
            [(p.name, p.auth_header, p.auth_scheme) for p in config.protocol_profiles],
            [("openai-chat", "Authorization", "Bearer"), ("anthropic-native", "x-api-key", "")],
        )

    def test_node_example(self) -> None:
        example = os.path.join(node_tests.EXAMPLE_DIR, "node.yaml")
        if not os.path.exists(example):
            raise self.skipTest("etc/iop/node.yaml is not in this tree")
        shutil.copy(example, os.path.join(self.base, "node.yaml"))
        self.write("node.token", "t\n")
        self.assertEqual(
            load_node_config(os.path.join(self.base, "node.yaml"), {}).security, NodeSecurity()
        )
