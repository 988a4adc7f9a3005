# -*- test-case-name: iop.test.runtime.test_events -*-
"""
What a run is asked to do, what an adapter can do, and the interfaces adapters provide.

An adapter instance is an :class:`IProvider`: ``execute(spec, emit)`` runs one request, calls
``emit`` for every event in order, and returns a Deferred that fires when the run is over.
Cancelling that Deferred cancels the run all the way down (the HTTP request is aborted, the
subprocess group killed). The Node's RunManager owns admission, sequencing and the guarantee of
exactly one terminal event; an adapter should emit its own terminal when it has one to give.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hyperlink import URL
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from zope.interface import Attribute, Interface

from iop.runtime.events import RuntimeEvent
from iop.runtime.spec import AdapterSpec
from iop.telemetry.tracing import TRACING_OFF, Tracing

Emit = Callable[[RuntimeEvent], None]


@dataclass(frozen=True)
class ExecutionSpec:
    """
    One normalized run. ``target`` is the served target (model name on the provider);
    ``input`` is adapter-interpreted: a plain prompt, or a JSON object with ``messages`` (and
    optionally ``tools``, ``tool_choice``, ``temperature``...) in OpenAI chat shape.
    ``collect``: the caller reads only the whole answer, so an adapter may ask its upstream for
    one answer rather than a stream (the events it emits are the same either way).
    """

    run_id: str
    target: str
    input: str
    workspace: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    session_id: str = ""
    background: bool = False
    timeout_sec: float = 0.0
    max_tokens: int = 0
    thinking_token_budget: int = 0
    collect: bool = False


@dataclass(frozen=True)
class Capabilities:
    max_concurrency: int
    streaming: bool = True
    tools: bool = False
    reasoning: bool = False
    sessions: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "max_concurrency": self.max_concurrency,
            "streaming": self.streaming,
            "tools": self.tools,
            "reasoning": self.reasoning,
            "sessions": self.sessions,
        }


class TreqClient(Protocol):
    """
    The HTTP client adapters and the provider tunnel use: what they call of treq (the ``treq``
    module, a pooled ``treq.client.HTTPClient``, or ``treq.testing.StubTreq`` in tests, which
    type-checks only through a ``cast``). The Deferred fires with an
    :class:`~twisted.web.iweb.IResponse` (typed ``Any``: ``Deferred`` is invariant, and treq's
    is a ``Deferred[_Response]``). ``reactor`` is the adapter's clock, for treq's own timers.
    ``url`` is text, or a hyperlink URL parsed once (see ``iop.node.adapters.http_client``).
    """

    def request(
        self,
        method: str,
        url: str | URL,
        *,
        headers: Any = None,
        data: bytes | None = None,
        unbuffered: bool = False,
        allow_redirects: bool = True,
        reactor: Any = None,
    ) -> Deferred[Any]: ...


@dataclass(frozen=True)
class AdapterContext:
    """
    What an adapter factory is given besides its spec: the reactor (timers; an adapter that
    runs processes adapts it to ``IReactorProcess``), the HTTP client (None on a context for
    adapters that make no HTTP requests: an HTTP adapter refuses to build without one) and the
    node's tracing (:data:`~iop.telemetry.tracing.TRACING_OFF` without ``telemetry:``).
    """

    reactor: IReactorTime
    http: TreqClient | None = None
    # The node's tracing (off without telemetry:): adapters' upstream calls and processes.
    tracing: Tracing = TRACING_OFF

    def require_http(self, adapter: str) -> TreqClient:
        """The HTTP client, or ValueError naming ``adapter`` when there is none."""
        if self.http is None:
            raise ValueError(f"the {adapter} adapter needs an HTTP client")
        return self.http


class IProvider(Interface):
    name = Attribute("The adapter instance name (str).")
    type = Attribute("The adapter type: a name in iop.runtime.kinds.PROVIDER_KINDS (str).")

    def capabilities() -> Capabilities:
        """What this instance can do; ``max_concurrency`` sizes its capacity gate."""

    def execute(spec: ExecutionSpec, emit: Emit) -> Deferred[None]:
        """
        Run ``spec``, calling ``emit`` for each event in order. The Deferred fires when the run
        is over (it may fail: the RunManager turns that into an ``error`` terminal). Cancelling
        it must stop the work (abort the HTTP request, kill the process group).
        """


class IResizable(Interface):
    """
    Optional: a provider whose ``capabilities().max_concurrency`` follows a live change of its
    adapter's ``max_concurrency`` (a config refresh resizes the instance's capacity gate and
    tells the provider, so what it reports stays the gate's limit). Only the number it reports
    changes; nothing it runs is cut.
    """

    def resize(max_concurrency: int) -> None:
        """Report ``max_concurrency`` (at least 1) from now on."""


class ISessionTerminator(Interface):
    """Optional: adapters that keep logical sessions (CLI agents)."""

    def list_sessions() -> list[dict[str, object]]:
        """Known sessions: at least ``session_id``, ``target`` and ``active``."""

    def terminate_session(target: str, session_id: str) -> Deferred[bool]:
        """End a session; True when it existed."""


class ITunnelProvider(Interface):
    """
    Optional: HTTP providers that can serve the raw provider tunnel (OpenAI-compatible servers:
    ``openai_compat``, ``vllm``). The Node opens the provider request itself, on the provider's
    base URL, with its configured headers, its HTTP client and its clock; the body is the one the
    Edge built, passed through untouched.
    """

    base_url = Attribute("The provider's base URL without a trailing slash (str).")
    profile = Attribute(
        "The resolved protocol profile delivered with the adapter's spec "
        "(:class:`iop.runtime.spec.RuntimeProfile`), or None when none was delivered."
    )
    idle_timeout = Attribute("Seconds to wait for the next upstream byte (float, > 0).")
    http = Attribute("The HTTP client (:class:`TreqClient`).")
    clock = Attribute("The reactor (``IReactorTime``): timers, and the ``reactor=`` given to treq.")

    def configured_headers() -> Mapping[str, str]:
        """The configured upstream headers (credentials included): send, never log or echo."""

    def redact(text: str) -> str:
        """``text`` without any configured header value (an upstream may echo credentials)."""


# ``iop.node.adapters.<type>.build``: an adapter instance from its spec; raises ValueError (or
# any exception) when the spec cannot be served.
AdapterFactory = Callable[[AdapterSpec, AdapterContext], IProvider]


class IOllamaAPI(Interface):
    """Ollama's own API queries, answered by ``ollama`` adapter instances (node commands)."""

    def tags() -> Deferred[dict[str, Any]]:
        """GET /api/tags: the models the server has."""

    def ps() -> Deferred[dict[str, Any]]:
        """GET /api/ps: the models loaded now."""

    def show(model: str) -> Deferred[dict[str, Any]]:
        """POST /api/show: one model's details."""
