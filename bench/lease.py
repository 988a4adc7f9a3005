"""
The CPU cost of managed mode's credential lease, per request, by recipient key type: what the
Edge spends issuing one (bind is negligible; sign + HPKE seal) and what the Node spends
verifying and opening one (signature, checks, HPKE open, replay cache). Measured in process CPU
time (``time.process_time``), so other load on the machine does not inflate it the way it does
wall-clock throughput; the throughput scenario's ``iop-managed`` target shows the same cost
end to end.

``python -m bench.lease [--iterations N]`` prints the JSON; :func:`measure` is what
:mod:`bench.run` records.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from iop.security.keys import KEMS, generate_issuer, generate_recipient
from iop.security.lease import LeaseVerifier, ReplayCache, issue_lease, zero
from iop.wire import runtime_pb2 as pb

SECRET = b"sk-bench-" + b"x" * 40


def _binding() -> pb.CredentialBinding:
    return pb.CredentialBinding(
        principal="bench-client",
        slot="upstream",
        route="bench-tunnel:bench/bench-openai",
        profile="openai-chat",
        target="demo-model",
        node_recipient="bench",
        credential_revision=1,
        route_revision=1,
        projection_generation=1,
    )


def measure(iterations: int = 2000) -> list[dict[str, Any]]:
    """Per KEM: µs of CPU per issue and per verify-and-open, and the lease's size."""
    rows: list[dict[str, Any]] = []
    issuer = generate_issuer()
    binding = _binding()
    for kem in KEMS:
        recipient = generate_recipient(kem)
        public = recipient.public_key()
        now = time.time()
        started = time.process_time()
        leases = [
            issue_lease(
                binding=binding,
                secret=SECRET,
                recipient=public,
                issuer=issuer,
                now=now,
                ttl_sec=300,
            )
            for _ in range(iterations)
        ]
        issued = time.process_time() - started
        verifier = LeaseVerifier(
            node_id="bench",
            recipient=recipient,
            issuer=issuer.public_key(),
            clock_skew_sec=5,
            replay=ReplayCache(capacity=iterations + 1),
        )
        started = time.process_time()
        for lease in leases:
            zero(verifier.open(lease, binding, now))
        opened = time.process_time() - started
        rows.append(
            {
                "kem": kem,
                "iterations": iterations,
                "lease_bytes": len(leases[0]),
                "issue_us": round(issued / iterations * 1e6, 1),
                "open_us": round(opened / iterations * 1e6, 1),
                "total_us": round((issued + opened) / iterations * 1e6, 1),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lease", description=__doc__)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.iterations), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
