"""The ``telemetry:`` section of edge.yaml and node.yaml (:mod:`iop.config.telemetry`)."""

from __future__ import annotations

import os
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.config.model import TelemetryConfig
from iop.test.config import test_node_config
from iop.test.config.test_edge_config import (
    ENVIRON,
    EdgeConfigTestMixin,
    assertIssue,
    base_config,
)

SECRET = "otlp-secret-value-4242"


class EdgeTelemetryTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def with_telemetry(self, section: Any) -> dict[str, Any]:
        data = base_config()
        data["telemetry"] = section
        return data

    def error(self, section: Any, environ: dict[str, str] | None = None) -> ConfigError:
        data = self.with_telemetry(section)
        environ = {**ENVIRON, **(environ or {})}
        error: ConfigError = self.assertRaises(ConfigError, self.parse, data, environ)
        return error

    def test_absent(self) -> None:
        """No section: no telemetry at all."""
        self.assertIsNone(self.parse(base_config()).telemetry)

    def test_defaults(self) -> None:
        config = self.parse(self.with_telemetry({"endpoint": "http://collector:4318"}))
        self.assertEqual(config.telemetry, TelemetryConfig("http://collector:4318/v1/traces"))
        assert config.telemetry is not None
        self.assertEqual(config.telemetry.sampling_ratio, 1.0)
        self.assertFalse(config.telemetry.capture_content)

    def test_full(self) -> None:
        headers_file = os.path.join(self.base, "otlp-headers")
        with open(headers_file, "w") as f:
            f.write("# the tenant\nX-Scope-OrgID: team-a\n\n")
        section = {
            "endpoint": "https://tempo.example.com/otlp/v1/traces",
            "headers": {"Authorization": "Bearer ${OTLP_TOKEN}"},
            "headers_file": "otlp-headers",
            "sampling_ratio": 0.25,
            "service_name": "edge-eu",
            "capture_content": True,
            "queue_size": 100,
            "export_timeout_sec": 3,
            "shutdown_timeout_sec": 0,
        }
        config = self.parse(self.with_telemetry(section), {**ENVIRON, "OTLP_TOKEN": SECRET})
        telemetry = config.telemetry
        assert telemetry is not None
        self.assertEqual(telemetry.endpoint, "https://tempo.example.com/otlp/v1/traces")
        self.assertEqual(
            [(name, value.reveal()) for name, value in telemetry.headers],
            [("Authorization", f"Bearer {SECRET}"), ("X-Scope-OrgID", "team-a")],
        )
        self.assertEqual(
            (telemetry.sampling_ratio, telemetry.service_name, telemetry.capture_content),
            (0.25, "edge-eu", True),
        )
        self.assertEqual(
            (telemetry.queue_size, telemetry.export_timeout_sec, telemetry.shutdown_timeout_sec),
            (100, 3.0, 0.0),
        )
        self.assertNotIn(SECRET, repr(config))
        self.assertNotIn(SECRET, str(telemetry))

    def test_endpoint_required_and_checked(self) -> None:
        assertIssue(self, self.error({}), "telemetry.endpoint", "is required")
        for bad in ("collector:4318", "ftp://x/", "http://"):
            assertIssue(self, self.error({"endpoint": bad}), "telemetry.endpoint", "http://")
        error = self.error({"endpoint": f"http://user:{SECRET}@collector:4318/"})
        assertIssue(self, error, "telemetry.endpoint", "credentials")
        self.assertNotIn(SECRET, str(error))

    def test_bad_values(self) -> None:
        base = {"endpoint": "http://c:4318"}
        assertIssue(
            self, self.error({**base, "sampling_ratio": 2}), "telemetry.sampling_ratio", "between"
        )
        assertIssue(self, self.error({**base, "queue_size": 0}), "telemetry.queue_size", ">=")
        assertIssue(
            self,
            self.error({**base, "capture_content": "yes"}),
            "telemetry.capture_content",
            "boolean",
        )
        assertIssue(self, self.error({**base, "sampel_ratio": 1}), "telemetry.sampel_ratio", "mean")

    def test_header_errors_never_show_values(self) -> None:
        base = {"endpoint": "http://c:4318"}
        error = self.error({**base, "headers": {"Authorization": "${NOT_SET}"}})
        assertIssue(self, error, "telemetry.headers.Authorization", "NOT_SET is not set")
        error = self.error({**base, "headers": {"bad name": SECRET}})
        assertIssue(self, error, 'telemetry.headers["bad name"]', "header name")
        error = self.error({**base, "headers": {"A": f"{SECRET}\nB: x"}})
        assertIssue(self, error, "telemetry.headers.A", "control character")
        headers_file = os.path.join(self.base, "bad-headers")
        with open(headers_file, "w") as f:
            f.write(f"{SECRET}\nAuthorization: one\n")
        error = self.error(
            {**base, "headers": {"authorization": "two"}, "headers_file": headers_file}
        )
        self.assertIn("line 1): must be a 'Name: value' line", str(error))
        self.assertIn("line 2): header 'Authorization' is set twice", str(error))
        self.assertNotIn(SECRET, str(error))
        error = self.error({**base, "headers_file": "missing-file"})
        assertIssue(self, error, "telemetry.headers_file", "does not exist")
        self.assertNotIn(SECRET, str(self.error({**base, "headers": {"A": f"{SECRET}\n"}})))


class NodeTelemetryTests(test_node_config.NodeConfigTestCase):
    def test_node_section(self) -> None:
        data = test_node_config.base_config()
        data["telemetry"] = {"endpoint": "http://collector:4318", "service_name": "gpu-1"}
        config = self.parse(data)
        self.assertEqual(
            config.telemetry,
            TelemetryConfig("http://collector:4318/v1/traces", service_name="gpu-1"),
        )
        self.assertIsNone(self.parse(test_node_config.base_config()).telemetry)
