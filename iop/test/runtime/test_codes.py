from twisted.trial.unittest import SynchronousTestCase

from iop.runtime.codes import ERROR_CODE_KEY, ErrorCode, error_code


class ErrorCodeTests(SynchronousTestCase):
    def test_known(self) -> None:
        self.assertIs(
            error_code({ERROR_CODE_KEY: "provider_at_capacity"}), ErrorCode.PROVIDER_AT_CAPACITY
        )

    def test_absent_or_unknown(self) -> None:
        self.assertIsNone(error_code({}))
        self.assertIsNone(error_code({ERROR_CODE_KEY: "from_a_newer_node"}))
