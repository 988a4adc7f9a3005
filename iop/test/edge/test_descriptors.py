# -*- test-case-name: iop.test.edge.test_descriptors -*-
"""
The client listener's caps from the open-file limit (:mod:`iop.edge.descriptors`), and the
Edge's start-up use of them (:func:`iop.edge.tap.descriptor_caps`, its start log line).
"""

from __future__ import annotations

import copy
import resource
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.selectreactor import SelectReactor
from twisted.internet.testing import EventLoggingObserver, MemoryReactorClock
from twisted.logger import Logger, LogLevel
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from iop.config import parse_edge_config
from iop.config.model import EdgeConfig
from iop.edge.descriptors import (
    MIN_CLIENT_CONNECTIONS,
    ClientCaps,
    DescriptorLimit,
    TooFewDescriptors,
    client_caps,
    descriptor_caps,
    raise_soft_limit,
    refusal_room,
    reserve,
    wanted_limit,
)

NOFILE = resource.RLIMIT_NOFILE


class ReserveTests(SynchronousTestCase):
    def test_grows_with_the_nodes_and_a_cluster(self) -> None:
        one = reserve(1)
        self.assertEqual(reserve(11) - one, 20)  # two per node
        self.assertEqual(reserve(1, cluster=True) - one, 8)
        # Under the common default soft limit most of it is left for clients.
        self.assertLess(one, 1024 // 4)

    def test_wanted_limit_serves_the_configured_cap_unclamped(self) -> None:
        for served in (17, 100, 4096, 100_000):
            wanted = wanted_limit(reserve(3), served)
            caps = client_caps(served, None, wanted - reserve(3))
            self.assertEqual((caps.max_connections, caps.clamped), (served, ()))
            clamped = client_caps(served, None, wanted - reserve(3) - 1)
            self.assertLess(clamped.max_connections, served)


class ClientCapsTests(SynchronousTestCase):
    def test_unlimited_takes_the_config(self) -> None:
        self.assertEqual(client_caps(4096, None), ClientCaps(4096 + 512, 4096, 1024))
        self.assertEqual(client_caps(100, 100), ClientCaps(116, 100, 100))
        self.assertEqual(client_caps(100, 7).max_connections_per_peer, 7)

    def test_the_per_peer_default_is_a_quarter(self) -> None:
        self.assertEqual(client_caps(100, None).max_connections_per_peer, 25)
        self.assertEqual(client_caps(3, None).max_connections_per_peer, 1)

    def test_the_defaults_under_1024_files(self) -> None:
        available = 1024 - reserve(1)
        caps = client_caps(4096, None, available)
        # Served and refusing connections together stay inside what is left.
        self.assertLessEqual(caps.descriptors, available)
        served = caps.max_connections
        self.assertEqual(caps.descriptors, served + refusal_room(served))
        self.assertGreater(caps.max_connections, available * 3 // 4)
        self.assertEqual(caps.max_connections_per_peer, caps.max_connections // 4)
        # The default per-peer cap follows the served one: not clamped, derived.
        self.assertEqual(caps.clamped, (("max_connections", 4096),))

    def test_an_explicit_per_peer_cap_over_the_affordable_is_clamped(self) -> None:
        caps = client_caps(4096, 4096, 1024 - reserve(1))
        self.assertEqual(caps.max_connections_per_peer, caps.max_connections)
        self.assertEqual(
            caps.clamped, (("max_connections", 4096), ("max_connections_per_peer", 4096))
        )

    def test_too_few(self) -> None:
        e = self.assertRaises(TooFewDescriptors, client_caps, 4096, None, 10)
        self.assertIn("at least 16", str(e))
        self.assertRaises(TooFewDescriptors, client_caps, 4096, None, -50)
        self.assertEqual(
            client_caps(4096, None, MIN_CLIENT_CONNECTIONS + 16).max_connections,
            MIN_CLIENT_CONNECTIONS,
        )

    @given(
        st.integers(1, 1_000_000),
        st.one_of(st.none(), st.integers(1, 1_000_000)),
        st.integers(MIN_CLIENT_CONNECTIONS + 16, 2_000_000),
    )
    def test_never_past_what_is_available(
        self, served: int, per_peer: int | None, available: int
    ) -> None:
        caps = client_caps(served, per_peer, available)
        self.assertLessEqual(caps.descriptors, available)
        self.assertLessEqual(caps.max_connections, served)
        self.assertGreaterEqual(caps.max_connections, MIN_CLIENT_CONNECTIONS if served >= 16 else 1)
        self.assertLessEqual(caps.max_connections_per_peer, caps.max_connections)
        self.assertGreater(caps.descriptors - caps.max_connections, 0)
        if per_peer is None:
            self.assertLessEqual(caps.max_connections_per_peer, max(1, caps.max_connections // 4))


class Limits:
    """getrlimit/setrlimit over a soft and hard limit held here."""

    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse
        self.sets: list[tuple[int, int]] = []

    def get(self, which: int) -> tuple[int, int]:
        assert which == NOFILE
        return self.soft, self.hard

    def set(self, which: int, limits: tuple[int, int]) -> None:
        assert which == NOFILE
        if self.refuse:
            raise ValueError("not allowed to raise maximum limit")
        self.sets.append(limits)
        self.soft, self.hard = limits

    def read(self, wanted: int | None, *, ceiling: int | None = None) -> DescriptorLimit:
        return raise_soft_limit(wanted, ceiling=ceiling, getrlimit=self.get, setrlimit=self.set)


class RaiseSoftLimitTests(SynchronousTestCase):
    def test_raised_as_far_as_wanted(self) -> None:
        limits = Limits(1024, 524288)
        self.assertEqual(limits.read(5000), DescriptorLimit(1024, 5000, 524288))
        self.assertEqual(limits.sets, [(5000, 524288)])

    def test_never_past_the_hard_limit_or_the_ceiling(self) -> None:
        self.assertEqual(Limits(1024, 2048).read(5000), DescriptorLimit(1024, 2048, 2048))
        self.assertEqual(Limits(256, 4096).read(5000, ceiling=1024).soft, 1024)

    def test_never_lowered(self) -> None:
        limits = Limits(65536, 65536)
        self.assertEqual(limits.read(5000), DescriptorLimit(65536, 65536, 65536))
        self.assertEqual(limits.read(None).soft, 65536)
        self.assertEqual(limits.sets, [])

    def test_unlimited_and_refused(self) -> None:
        limits = Limits(1024, resource.RLIM_INFINITY)
        self.assertEqual(limits.read(9000).soft, 9000)
        self.assertEqual(Limits(1024, 4096, refuse=True).read(9000).soft, 1024)

    def test_the_real_limit_is_read(self) -> None:
        soft, hard = resource.getrlimit(NOFILE)
        self.assertEqual(raise_soft_limit(None), DescriptorLimit(soft, soft, hard))


ENV = {"T1": "token-one", "T2": "token-two"}
EDGE: dict[str, Any] = {
    "listen": {"nodes": "tcp:7443:interface=127.0.0.1", "admin": "tcp:8081:interface=127.0.0.1"},
    "node_transport": {"plaintext": True},
    "nodes": [{"id": "n1", "token": "${T1}"}, {"id": "n2", "token": "${T2}"}],
    "openai": {"listen": "tcp:8080:interface=127.0.0.1", "auth": {"enabled": False}},
}


def edge_config(**openai: Any) -> EdgeConfig:
    data = copy.deepcopy(EDGE)
    data["openai"].update(openai)
    return parse_edge_config(data, base_dir=".", environ=ENV)


class StartTests(SynchronousTestCase):
    """What makeService takes from the limit, and says at start."""

    def start_log(self, config: EdgeConfig, limits: Limits) -> list[dict[str, Any]]:
        report, _ = descriptor_caps(config, MemoryReactorClock(), limits.read)
        events = EventLoggingObserver()
        report.log = Logger(observer=events)
        report.startService()
        return list(events)

    def test_raises_the_soft_limit_for_the_configured_caps(self) -> None:
        limits = Limits(1024, 524288)
        report, caps = descriptor_caps(edge_config(), MemoryReactorClock(), limits.read)
        self.assertEqual(limits.soft, wanted_limit(reserve(2), 4096))
        self.assertEqual(caps, ClientCaps(4096 + 512, 4096, 1024))
        self.assertEqual(report.limit.found, 1024)

    def test_clamped_under_a_hard_limit_with_a_warning(self) -> None:
        limits = Limits(1024, 1024)
        _, caps = descriptor_caps(edge_config(), MemoryReactorClock(), limits.read)
        assert caps is not None
        self.assertEqual(caps, client_caps(4096, None, 1024 - reserve(2)))
        events = self.start_log(edge_config(), Limits(1024, 1024))
        info, warning = events
        self.assertEqual(info["log_level"], LogLevel.info)
        self.assertEqual(
            (info["soft"], info["found"], info["hard"], info["reserve"]),
            (1024, 1024, "1024", reserve(2)),
        )
        self.assertEqual(
            (info["max_connections"], info["per_peer"], info["descriptors"]),
            (caps.max_connections, caps.max_connections_per_peer, caps.descriptors),
        )
        self.assertEqual(warning["log_level"], LogLevel.warn)
        self.assertEqual((warning["key"], warning["given"]), ("max_connections", 4096))
        self.assertEqual(warning["cap"], caps.max_connections)
        self.assertEqual(warning["wanted"], wanted_limit(reserve(2), 4096))

    def test_an_explicit_per_peer_cap_is_clamped_too(self) -> None:
        config = edge_config(max_connections=2000, max_connections_per_peer=2000)
        events = self.start_log(config, Limits(1024, 1024))
        self.assertEqual(
            [(e["key"], e["given"]) for e in events[1:]],
            [("max_connections", 2000), ("max_connections_per_peer", 2000)],
        )

    def test_no_client_listener(self) -> None:
        config = parse_edge_config(
            {k: v for k, v in EDGE.items() if k != "openai"}, base_dir=".", environ=ENV
        )
        limits = Limits(1024, 524288)
        _, caps = descriptor_caps(config, MemoryReactorClock(), limits.read)
        self.assertIsNone(caps)
        self.assertEqual(limits.sets, [])  # the reserve fits: nothing to raise
        [event] = self.start_log(config, Limits(1024, 1024))
        self.assertIn("no client listener", event["log_format"])

    def test_too_few_files_refuses_to_start(self) -> None:
        e = self.assertRaises(
            usage.UsageError,
            descriptor_caps,
            edge_config(),
            MemoryReactorClock(),
            Limits(160, 160).read,
        )
        self.assertIn("raise LimitNOFILE", str(e))

    def test_the_select_reactor_stays_under_fd_setsize(self) -> None:
        limits = Limits(256, 524288)
        _, caps = descriptor_caps(edge_config(), SelectReactor(), limits.read)
        self.assertEqual(limits.soft, 1024)
        self.assertEqual(caps, client_caps(4096, None, 1024 - reserve(2)))
