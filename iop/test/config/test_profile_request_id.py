"""``protocol_profiles[].send_request_id``: unset follows the driver; set, it decides."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.config import ConfigError
from iop.config.model import ProfileConfig
from iop.test.config.test_edge_config import EdgeConfigTestMixin, assertIssue, base_config


class SendRequestIdTests(EdgeConfigTestMixin, SynchronousTestCase):
    def setUp(self) -> None:
        self.make_base(self)

    def test_unset_follows_the_driver(self) -> None:
        (profile,) = self.parse(base_config()).protocol_profiles
        self.assertIsNone(profile.send_request_id)
        self.assertTrue(profile.sends_request_id)
        self.assertFalse(ProfileConfig("a", "anthropic_messages").sends_request_id)
        self.assertTrue(ProfileConfig("r", "openai_responses").sends_request_id)

    def test_set_it_decides(self) -> None:
        data = base_config()
        data["protocol_profiles"][0]["send_request_id"] = False
        (profile,) = self.parse(data).protocol_profiles
        self.assertFalse(profile.sends_request_id)
        self.assertTrue(
            ProfileConfig("a", "anthropic_messages", send_request_id=True).sends_request_id
        )

    def test_a_boolean(self) -> None:
        data = base_config()
        data["protocol_profiles"][0]["send_request_id"] = "yes"
        error = self.assertRaises(ConfigError, self.parse, data)
        assertIssue(self, error, "protocol_profiles[0].send_request_id", "boolean")
