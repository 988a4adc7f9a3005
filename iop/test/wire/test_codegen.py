"""The committed generated module matches the schema."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from iop.wire import codegen


class CodegenTests(SynchronousTestCase):
    def test_committed_module_is_fresh(self) -> None:
        """
        Regenerating from proto/iop/runtime.proto yields exactly the committed files; when this
        fails, run ``make proto`` and commit the result.
        """
        generated = codegen.generate()
        for name, content in generated.items():
            committed = (codegen.OUTPUT_DIR / name).read_bytes()
            self.assertEqual(
                committed, content, f"iop/wire/{name} is stale: run `make proto` and commit it"
            )

    def test_operation_is_field_13(self) -> None:
        from iop.wire.runtime_pb2 import ProviderTunnelRequest

        self.assertEqual(ProviderTunnelRequest.DESCRIPTOR.fields_by_name["operation"].number, 13)
