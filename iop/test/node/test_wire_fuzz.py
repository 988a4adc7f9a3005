# -*- test-case-name: iop.test.node.test_wire_fuzz -*-
"""
An Edge-side attacker against the node: mutated envelopes and frames, in every connection state.

The real node protocol (:class:`~iop.node.transport.EdgeConnectionProtocol`, built by
:class:`~iop.node.transport.EdgeConnectionFactory`) with the real session handlers
(:func:`~iop.node.handlers.make_session_setup`: runs, tunnels, cancels, commands) over fake
adapters — scripted run providers, an OpenAI-compatible tunnel provider whose upstream never
answers by itself — on a ``StringTransport`` and a ``task.Clock``. Hypothesis draws a script: an
``Envelope`` of any oneof kind with random field values (out-of-range enums, huge strings,
random bytes, nested messages), a valid frame with mutated bytes, a wrong length prefix, a
register response with a random config, the handshake's own answers at random points (so
every state is hit: before the handshake, registering, applying, ready), clock advances and
provider progress. Then the connection is lost.

The properties: no exception escapes the protocol and nothing is logged as a failure
(traceback); a ready node that stays open answers every command and cancel request at once; a
connection the node closes has a reason, logged; afterwards every session is
closed, no run or tunnel is active, every adapter's capacity gate is empty, every provider
execution and upstream request was finished or cancelled, and no delayed call is left on the
clock.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from iop.node.adapters.openai_compat import OpenAICompatProvider
from iop.node.errors import NodeError
from iop.node.handlers import make_session_setup
from iop.node.session import NodeSession, SessionBuilder
from iop.node.store import RunStatus, RunStore, SynchronousExecutor
from iop.node.transport import EdgeConnectionFactory, EdgeConnectionProtocol
from iop.runtime import AdapterContext, AdapterSpec, IProvider, RuntimeEvent, Usage
from iop.test import examples
from iop.test.node.fakes import TOKEN, accepted, drain, frame, ready_response
from iop.test.node.test_runs import FakeOllama, ScriptedProvider, SessionProvider
from iop.wire import runtime_pb2 as pb

F = FieldDescriptor
INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
HUGE = "x" * 70_000

# Strings and bytes that mean something to the node, and some that mean nothing.
strings = st.one_of(
    st.sampled_from(
        [
            "", "gpu", "up", "local", "agent", "r1", "r2", "t1", "node-1", "chat_completions",
            "responses", "messages", "count_tokens", "POST", "GET", "DELETE", "m", "sess",
            "/v1/chat/completions", "../../etc/passwd", "{}", '{"model": "m"}', "\x00", "\ud7ff",
            "error", "delta", "complete", "start", "cancelled",
        ]
    ),
    st.text(max_size=12),
    st.just(HUGE),
)  # fmt: skip
blobs = st.one_of(
    st.sampled_from([b"", b'{"model": "m", "messages": []}', b"\xff\xfe\x00", b"{"]),
    st.binary(max_size=40),
)


def _integers(field: Any) -> st.SearchStrategy[int]:
    low, high = INT_RANGES[field.type]
    edges = [
        v for v in (0, 1, -1, 2, 60, 3600, 2**31 - 1, 2**32 - 1, low, high) if low <= v <= high
    ]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _scalar(field: Any) -> st.SearchStrategy[Any]:
    if field.type in INT_RANGES:
        return _integers(field)
    if field.type == F.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if field.type == F.TYPE_STRING:
        return strings
    if field.type == F.TYPE_BYTES:
        return blobs
    raise AssertionError(f"unhandled field type {field.type}")


def messages_of(descriptor: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Any message of ``descriptor``'s type: a random subset of its fields, random values."""
    cls = getattr(pb, descriptor.name, None) or _message_class(descriptor)
    field_values: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            key, value = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            if value.message_type is not None:
                continue
            field_values[field.name] = st.dictionaries(_scalar(key), _scalar(value), max_size=3)
        elif field.message_type is not None:
            if depth >= 2:
                continue
            inner = _nested(field.message_type, depth + 1)
            if field.is_repeated:
                field_values[field.name] = st.lists(inner, max_size=3)
            else:
                field_values[field.name] = inner
        elif field.is_repeated:
            field_values[field.name] = st.lists(_scalar(field), max_size=3)
        else:
            field_values[field.name] = _scalar(field)

    def build(values: dict[str, Any]) -> Message:
        message = cls()
        for name, value in values.items():
            field = descriptor.fields_by_name[name]
            target = getattr(message, name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                for k, v in value.items():
                    target[k] = v
            elif field.message_type is not None and field.is_repeated:
                for item in value:
                    target.add().CopyFrom(item)
            elif field.message_type is not None:
                target.CopyFrom(value)
            elif field.is_repeated:
                target.extend(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries({}, optional=field_values).map(build)


def _nested(descriptor: Any, depth: int) -> st.SearchStrategy[Any]:
    return st.deferred(lambda: messages_of(descriptor, depth))


def _message_class(descriptor: Descriptor) -> type[Message]:
    return GetMessageClass(descriptor)


KINDS = [f.name for f in pb.Envelope.DESCRIPTOR.oneofs_by_name["message"].fields]


@st.composite
def envelopes(draw: st.DrawFn) -> pb.Envelope:
    """An ``Envelope`` of any oneof kind (requests the node serves most often)."""
    kind = draw(
        st.one_of(
            st.sampled_from(KINDS),
            st.sampled_from(
                ["run_request", "cancel_request", "provider_tunnel_request", "node_command_request"]
            ),
        )
    )
    field = pb.Envelope.DESCRIPTOR.fields_by_name[kind]
    inner = draw(messages_of(field.message_type))
    envelope = pb.Envelope()
    getattr(envelope, kind).CopyFrom(inner)
    return envelope


@st.composite
def plausible_requests(draw: st.DrawFn) -> pb.Envelope:
    """Requests aimed at what the node has (its adapters, its run ids), with hostile details."""
    run_id = draw(st.sampled_from(["r1", "r2", "t1", "t2"]))
    adapter = draw(st.sampled_from(["gpu", "up", "local", "agent", "nope", ""]))
    kind = draw(st.sampled_from(["run", "tunnel", "cancel", "command"]))
    if kind == "run":
        return pb.Envelope(
            run_request=pb.RunRequest(
                run_id=run_id,
                adapter=adapter,
                target=draw(strings),
                input=draw(strings),
                timeout_sec=draw(st.sampled_from([0, 1, 60, 2**32 - 1])),
                max_tokens=draw(st.sampled_from([0, 1, 2**32 - 1])),
                session_id=draw(st.sampled_from(["", "sess"])),
            )
        )
    if kind == "tunnel":
        return pb.Envelope(
            provider_tunnel_request=pb.ProviderTunnelRequest(
                run_id=run_id,
                adapter=adapter,
                target=draw(strings),
                method=draw(st.sampled_from(["POST", "GET", "", "BREW"])),
                operation=draw(st.sampled_from(["chat_completions", "responses", "", "x/../y"])),
                body=draw(blobs),
                stream=draw(st.booleans()),
                timeout_sec=draw(st.sampled_from([0, 1, 30, 2**32 - 1])),
                headers=[
                    pb.Header(name=draw(strings), value=draw(strings))
                    for _ in range(draw(st.integers(0, 2)))
                ],
            )
        )
    if kind == "cancel":
        return pb.Envelope(
            cancel_request=pb.CancelRequest(
                kind=draw(st.sampled_from([0, 1, 2, 3, 99, -1])),  # type: ignore[arg-type]
                run_id=run_id,
                session_id=draw(st.sampled_from(["", "sess"])),
                adapter=adapter,
                target=draw(strings),
            )
        )
    return pb.Envelope(
        node_command_request=pb.NodeCommandRequest(
            request_id=draw(st.sampled_from(["q1", "q2", ""])),
            type=draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 42])),  # type: ignore[arg-type]
            adapter=adapter,
            target=draw(strings),
            arguments=draw(
                st.dictionaries(
                    st.sampled_from(["session_id", "model", "limit", "x"]), strings, max_size=2
                )
            ),
        )
    )


def adapter_config(name: str, type_: str, **fields: Any) -> pb.AdapterConfig:
    values: dict[str, Any] = {
        "name": name,
        "type": type_,
        "enabled": True,
        "max_concurrency": 1,
        "base_url": "http://upstream.test/v1",
        "headers": {"Authorization": "Bearer sk-fuzz-upstream-secret"},
    }
    values.update(fields)
    return pb.AdapterConfig(**values)


GOOD_CONFIG = pb.NodeConfigPayload(
    node_id="node-1",
    alias="fuzz",
    config_revision=1,
    adapters=[
        adapter_config("gpu", "vllm"),
        adapter_config("up", "openai_compat", max_concurrency=2, idle_timeout_ms=30_000),
        adapter_config("local", "ollama"),
        adapter_config("agent", "cli"),
    ],
)


@st.composite
def register_responses(draw: st.DrawFn) -> pb.Envelope:
    """A register response: the good one, one with a hostile config, or anything."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return accepted(GOOD_CONFIG)
    if choice == 1:
        config = draw(messages_of(pb.NodeConfigPayload.DESCRIPTOR))
        return accepted(
            config,
            node_id=draw(strings),
            interval_ms=draw(st.sampled_from([0, 1, 2000, 2**32 - 1])),
            timeout_ms=draw(st.sampled_from([0, 1, 5000, 2**32 - 1])),
        )
    response = draw(messages_of(pb.RegisterResponse.DESCRIPTOR))
    return pb.Envelope(register_response=response)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid frame's bytes, mutated: a flipped or dropped byte, a lie in the length prefix."""
    envelope = draw(st.one_of(plausible_requests(), envelopes()))
    data = bytearray(envelope.SerializeToString())
    how = draw(st.sampled_from(["flip", "cut", "insert", "length", "garbage"]))
    if how == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data[i] ^= draw(st.integers(1, 255))
    elif how == "cut" and data:
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif how == "insert":
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=8))
    elif how == "garbage":
        data = bytearray(draw(st.binary(max_size=64)))
    length = len(data)
    if how == "length":
        length = draw(st.sampled_from([0, 1, len(data) + 1, 2**31, 2**32 - 1]))
        if length == len(data):
            length += 1
    return struct.pack("!I", length) + bytes(data)


# One step of the attacker's script.
steps = st.one_of(
    st.tuples(st.just("envelope"), envelopes()),
    st.tuples(st.just("envelope"), plausible_requests()),
    st.tuples(st.just("envelope"), plausible_requests()),
    st.tuples(st.just("envelope"), plausible_requests()),
    st.tuples(st.just("bytes"), mutated_frames()),
    st.tuples(st.just("register"), register_responses()),
    st.tuples(st.just("ready"), st.booleans()),
    st.tuples(st.just("advance"), st.sampled_from([0.0, 1.0, 3.0, 6.0, 31.0, 120.0])),
    st.tuples(st.just("provider"), st.integers(0, 5)),
    st.tuples(st.just("provider"), st.integers(0, 5)),
    st.tuples(st.just("upstream"), st.integers(0, 7)),
    st.tuples(st.just("batch"), st.lists(plausible_requests(), min_size=2, max_size=4)),
)


HANDSHAKE = [("register", accepted(GOOD_CONFIG)), ("ready", True)]
# Where the attacks start: the connection state they hit first.
PHASES = ["ready"] * 6 + ["applying"] * 2 + ["registering"] * 2 + ["dialing"]


@st.composite
def scripts(draw: st.DrawFn) -> tuple[str, list[tuple[str, Any]]]:
    """(the state the attack starts in, the steps after the handshake got there)."""
    phase = draw(st.sampled_from(PHASES))
    attack = draw(st.lists(steps, min_size=1, max_size=10))
    if phase == "ready":
        return phase, [*HANDSHAKE, *attack]
    if phase == "applying":
        # The ready answer may still come, anywhere among the attacks.
        attack.insert(draw(st.integers(0, len(attack))), HANDSHAKE[1])
        return phase, [HANDSHAKE[0], *attack]
    return phase, attack


# The requests a ready node answers at once, and their answers.
ANSWERS = {
    "node_command_request": "node_command_response",
    "cancel_request": "cancel_response",
}

# -- the node under attack ---------------------------------------------------------------------


class Upstream:
    """A treq-shaped client: every request pends until the script answers or fails it."""

    def __init__(self) -> None:
        self.pending: list[Deferred[Any]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred(lambda _: None)
        self.pending.append(d)
        return d


@implementer(ILogObserver)
class Events:
    def __init__(self) -> None:
        self.events: list[LogEvent] = []

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)


class Node:
    """One node connection, its sessions, providers and upstream, as an attacker sees them."""

    def __init__(self, case: SynchronousTestCase) -> None:
        self.case = case
        self.clock = Clock()
        self.store = RunStore(":memory:", self.clock, SynchronousExecutor())
        case.successResultOf(self.store.open())
        self.upstream = Upstream()
        self.providers: list[ScriptedProvider] = []
        self.sessions: list[NodeSession] = []
        setup = make_session_setup(self.store, self.clock)

        def equip(session: NodeSession) -> None:
            self.sessions.append(session)
            setup(session)

        context = AdapterContext(reactor=self.clock, http=self.upstream)  # type: ignore[arg-type]
        factories = {
            "vllm": self.scripted(ScriptedProvider),
            "ollama": self.scripted(FakeOllama),
            "cli": self.scripted(SessionProvider),
            "openai_compat": lambda spec, ctx: OpenAICompatProvider(spec, ctx),
        }
        factory = EdgeConnectionFactory(
            self.clock,
            SessionBuilder(context, factories, setup=equip),
            heartbeat_interval=2.0,
            heartbeat_timeout=5.0,
            max_frame_bytes=256 * 1024,
            hostname="fuzz-host",
        )
        self.protocol: EdgeConnectionProtocol = factory.buildProtocol(None)
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)
        self.handshake: Deferred[NodeSession] | None = None
        self.outcome: list[Any] = []
        self.sent: list[pb.Envelope] = []

    def scripted(self, cls: type[ScriptedProvider]) -> Callable[[AdapterSpec, Any], IProvider]:
        def build(spec: AdapterSpec, ctx: Any) -> IProvider:
            provider = cls(spec.name, spec.type, max_concurrency=spec.max_concurrency or 1)
            self.providers.append(provider)
            return provider  # type: ignore[return-value]

        return build

    def start(self) -> None:
        self.handshake = self.protocol.handshake(TOKEN, self.clock, 10)
        self.handshake.addBoth(self.outcome.append)

    def feed(self, data: bytes) -> None:
        if not self.transport.disconnecting:
            self.protocol.dataReceived(data)

    @property
    def ready(self) -> bool:
        return any(s.ready_at is not None and not s.closed for s in self.sessions)

    def requests(self, envelopes: list[pb.Envelope]) -> None:
        """Whole envelopes: to a ready node that stays open, each command and cancel is
        answered (a response for each, by the time the bytes are read)."""
        was_ready = self.ready and not self.transport.disconnecting
        before = self.answers()
        self.feed(b"".join(frame(e) for e in envelopes))
        if not was_ready or self.transport.disconnecting:
            return
        asked = Counter(e.WhichOneof("message") for e in envelopes)
        after = self.answers()
        for request, response in ANSWERS.items():
            self.case.assertEqual(after[response] - before[response], asked[request], request)

    def answers(self) -> Counter[str | None]:
        self.sent.extend(drain(self.transport))
        return Counter(e.WhichOneof("message") for e in self.sent)

    def step(self, kind: str, value: Any) -> None:
        if kind == "envelope":
            self.requests([value])
        elif kind == "register":
            self.feed(frame(value))
        elif kind == "bytes":
            self.feed(value)
        elif kind == "batch":
            self.requests(value)
        elif kind == "ready":
            self.feed(frame(ready_response(value, "" if value else "no")))
        elif kind == "advance":
            self.clock.advance(value)
        elif kind == "provider":
            self.provider_progress(value)
        elif kind == "upstream":
            self.upstream_progress(value)

    def provider_progress(self, how: int) -> None:
        live = [
            e for p in self.providers for e in p.executions if not e.deferred.called
        ]  # fmt: skip
        if not live:
            return
        execution = live[how % len(live)]
        if how == 0:
            execution.emit(RuntimeEvent.text("hi"))
        elif how == 1:
            execution.emit(RuntimeEvent.complete(Usage(1, 1)))
            execution.finish()
        elif how == 2:
            execution.emit(RuntimeEvent.failed("upstream HTTP 401: Bearer sk-leaked-0123456789"))
            execution.finish()
        elif how == 3:
            execution.deferred.errback(RuntimeError("provider blew up"))
        elif how == 4:
            execution.finish()  # ended without a terminal event
        else:
            execution.emit(RuntimeEvent.reasoning("thinking"))

    def upstream_progress(self, how: int) -> None:
        live = [d for d in self.upstream.pending if not d.called]
        if not live:
            return
        live[how % len(live)].errback(ConnectionRefusedError(f"upstream refused ({how})"))

    def lose(self) -> None:
        self.protocol.connectionLost(Failure(ConnectionDone("edge went away")))


class NodeWireFuzz(SynchronousTestCase):
    def check(self, node: Node, events: list[LogEvent]) -> None:
        # No traceback: nothing logged as a failure, nothing critical.
        failures = [e for e in events if "log_failure" in e]
        self.assertEqual(failures, [], [formatEvent(e) + str(e["log_failure"]) for e in failures])
        closed = node.transport.disconnecting
        if closed:
            # The node closed it, with a reason it logged.
            reason = node.protocol.close_reason
            assert reason, "closed without a reason"
            said = [formatEvent(e) for e in events if e.get("log_namespace", "").startswith("iop")]
            self.assertTrue(any(reason in s for s in said), said)
        node.lose()
        for session in node.sessions:
            self.assertTrue(session.closed)
            for instance in session.registry:
                self.assertEqual(instance.gate.in_use, 0, instance.name)
            handlers = session._handlers
            for kind in ("run_request", "provider_tunnel_request"):
                manager = getattr(handlers[kind], "__self__", None)
                if manager is not None and hasattr(manager, "active_count"):
                    self.assertEqual(manager.active_count(), 0, kind)
        for provider in node.providers:
            for execution in provider.executions:
                self.assertTrue(
                    execution.deferred.called or execution.cancelled, "a provider run left behind"
                )
        for d in node.upstream.pending:
            self.assertTrue(d.called, "an upstream request left behind")
        self.assertEqual(node.clock.getDelayedCalls(), [])
        for record in self.successResultOf(node.store.recent(1000)):
            self.assertNotEqual(record.status, RunStatus.RUNNING, record.run_id)
        # The handshake, if one was asked, has an outcome: a session or a node error.
        if node.handshake is not None:
            self.assertEqual(len(node.outcome), 1)
            outcome = node.outcome[0]
            if isinstance(outcome, Failure):
                self.assertIsInstance(outcome.value, NodeError, outcome.getTraceback())

    @settings(
        max_examples=examples(100),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(scripts())
    def test_hostile_edge(self, script: tuple[str, list[tuple[str, Any]]]) -> None:
        phase, body = script
        observer = Events()
        globalLogPublisher.addObserver(observer)
        node = Node(self)
        try:
            if phase == "dialing":
                # Before the node even asked to register.
                node.step(*body[0])
                body = body[1:]
            node.start()
            for kind, value in body:
                node.step(kind, value)
            self.check(node, observer.events)
        finally:
            globalLogPublisher.removeObserver(observer)
            self.successResultOf(node.store.close())
            self.flushLoggedErrors()
