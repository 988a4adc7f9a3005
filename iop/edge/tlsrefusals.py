# -*- test-case-name: iop.test.edge.test_tlsrefusals -*-
"""
Peers the node listener refused during the TLS handshake: each one counted, and logged without
flooding the log.

A handshake fails before any node protocol runs, so neither the registry nor the node's
connection machine ever hears of it: no certificate where managed mode requires one, a
certificate from another CA, expired or not meant for a client, a peer that ended the
handshake itself, or no TLS at all. :class:`TLSRefusals` is told by the node connection's
``connectionLost`` (only while no handshake has completed) and, when the loss was a TLS error,

- counts it by reason (:data:`~iop.security.tls.REFUSAL_REASONS`; :meth:`TLSRefusals.stats`,
  read by the metrics at scrape time as ``iop_node_tls_refused_total{reason}``), every one;
- logs ``refused node TLS handshake from HOST:PORT: <why>`` at warn, at most once per peer
  host and reason per minute and ten lines a minute in all (:class:`~iop.logs.limiter.
  LogLimiter`); what that holds back is summed up in one line a minute later.

Name mismatches (a certificate from the right CA naming another workload) pass the handshake
and are the registry's refusals (``iop_node_rejections_total{reason="workload_identity"}``).
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from iop.logs.limiter import LogLimiter
from iop.security.tls import REFUSAL_REASONS, HandshakeRefusal, handshake_refusal

#: One line per peer host and reason per this many seconds; and at most LOG_BURST lines in it.
LOG_INTERVAL = 60.0
LOG_BURST = 10


class TLSRefusals:
    """The node listener's refused handshakes: counts by reason, and their rate-limited log."""

    log = Logger()

    def __init__(
        self, clock: IReactorTime, interval: float = LOG_INTERVAL, burst: int = LOG_BURST
    ) -> None:
        self._counts = dict.fromkeys(REFUSAL_REASONS, 0)
        self._limiter = LogLimiter(clock, self._summary, interval, burst)

    def stats(self) -> dict[str, int]:
        """Refused handshakes since the Edge started, per reason (every reason present)."""
        return dict(self._counts)

    def connection_lost(self, transport: object, reason: Failure) -> HandshakeRefusal | None:
        """
        A node connection was lost before its TLS handshake completed, for ``reason``: when
        that was a TLS error, count and (rate permitting) log it. Returns the refusal, or None
        (the peer left or was dropped without a TLS error: nothing to count).
        """
        refusal = handshake_refusal(transport, reason)
        if refusal is None:
            return None
        self._counts[refusal.reason] += 1
        host, peer = _peer(transport)
        if self._limiter.admit((host, refusal.reason), refusal.reason):
            if refusal.subject is None:
                self.log.warn(
                    "refused node TLS handshake from {peer}: {detail}",
                    peer=peer,
                    detail=refusal.detail,
                    reason=refusal.reason,
                )
            else:
                self.log.warn(
                    "refused node TLS handshake from {peer}: {detail} (certificate {subject})",
                    peer=peer,
                    detail=refusal.detail,
                    subject=refusal.subject,
                    reason=refusal.reason,
                )
        return refusal

    def flush(self) -> None:
        """Log the summary of what is held back now."""
        self._limiter.flush()

    def _summary(self, count: int, by_reason: dict[str, int], since: float) -> None:
        self.log.warn(
            "refused {count} more node TLS handshakes in the last {interval:.0f} s, not logged "
            "one by one ({reasons})",
            count=count,
            interval=self._limiter.interval,
            reasons=", ".join(f"{r}: {n}" for r, n in sorted(by_reason.items())),
            by_reason=by_reason,
            since=since,
        )


def _peer(transport: object) -> tuple[str, str]:
    """(host, ``host:port``) of the transport's peer, as well as they can be told."""
    try:
        address = transport.getPeer()  # type: ignore[attr-defined]
    except Exception:
        return "?", "?"
    host = getattr(address, "host", None)
    port = getattr(address, "port", None)
    if host is None:
        return str(address), str(address)
    if port is None:
        return str(host), str(host)
    shown = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(host), shown
