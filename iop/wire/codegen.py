# -*- test-case-name: iop.test.wire.test_codegen -*-
"""
Regenerate ``iop/wire/runtime_pb2.py`` (+ ``.pyi``) from ``proto/iop/runtime.proto``.

``make proto`` runs ``python -m iop.wire.codegen``. The committed module must equal what this
produces; ``iop.test.wire.test_codegen`` fails when it is stale.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_FILE = Path("iop") / "runtime.proto"
OUTPUT_DIR = REPO_ROOT / "iop" / "wire"
GENERATED = ("runtime_pb2.py", "runtime_pb2.pyi")


def generate(proto_root: Path = PROTO_ROOT) -> dict[str, bytes]:
    """
    Run protoc (from grpcio-tools) on the schema and return the generated files by name.
    """
    from grpc_tools import protoc  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory() as out:
        rc = protoc.main(
            [
                "protoc",
                f"-I{proto_root}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                str(proto_root / PROTO_FILE),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        produced = Path(out) / PROTO_FILE.parent
        return {name: (produced / name).read_bytes() for name in GENERATED}


def main() -> int:
    for name, content in generate().items():
        (OUTPUT_DIR / name).write_bytes(content)
        print(f"wrote iop/wire/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
