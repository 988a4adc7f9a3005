"""
The attribute names IOP's spans carry, from OpenTelemetry's semantic conventions (GenAI v1.41,
"development"; HTTP, stable), and how IOP's provider kinds map to ``gen_ai.provider.name``.

Kept in one module so a rename in the conventions is one edit; the SDK's own
``opentelemetry-semantic-conventions`` package moves its GenAI names between releases.
"""

from __future__ import annotations

from typing import Protocol


class Usage(Protocol):
    """What :func:`usage_attributes` reads (``iop.runtime.events.Usage``, not imported: the
    runtime vocabulary imports this package)."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def reasoning_tokens(self) -> int | None: ...
    @property
    def cached_input_tokens(self) -> int | None: ...
    @property
    def cache_write_tokens(self) -> int | None: ...


__all__ = [
    "ERROR_TYPE",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_MODEL",
    "HTTP_REQUEST_METHOD",
    "HTTP_RESPONSE_STATUS_CODE",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "URL_FULL",
    "operation_name",
    "provider_name",
    "usage_attributes",
]

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"

HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
URL_FULL = "url.full"
ERROR_TYPE = "error.type"

# IOP's own (namespaced as the conventions ask for attributes of one product).
IOP_RUN_ID = "iop.run_id"
#: The client request's id (``x-request-id``), on the Edge's and the node's spans alike.
IOP_REQUEST_ID = "iop.request_id"
IOP_NODE_ID = "iop.node.id"
IOP_ADAPTER = "iop.adapter"
IOP_OUTCOME = "iop.outcome"
IOP_ERROR_CODE = "iop.error_code"
IOP_BODY_BYTES = "iop.response.body_bytes"
PROCESS_EXECUTABLE_NAME = "process.executable.name"
PROCESS_PID = "process.pid"

# gen_ai.provider.name per adapter kind: the conventions' well-known value where one fits
# (an OpenAI-compatible upstream speaks OpenAI's API), else the product's own lower-case name.
_PROVIDERS = {
    "openai_compat": "openai",
    "vllm": "vllm",
    "ollama": "ollama",
    "cli": "cli",
}
# CLI dialects (the agent a CLI adapter drives) → the provider behind it.
_CLI_PROVIDERS = {"claude": "anthropic", "codex": "openai", "gemini": "gcp.gemini"}

# IOP's operation names (the tunnel's and the routes') → gen_ai.operation.name.
_OPERATIONS = {
    "chat": "chat",
    "chat_completions": "chat",
    "responses": "chat",
    "messages": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}


def provider_name(kind: str, dialect: str = "") -> str:
    """``gen_ai.provider.name`` for an adapter of ``kind`` (a CLI one: by its ``dialect``)."""
    if kind == "cli" and dialect:
        return _CLI_PROVIDERS.get(dialect, dialect)
    return _PROVIDERS.get(kind, kind)


def operation_name(operation: str) -> str:
    """``gen_ai.operation.name`` for an IOP operation (``chat`` when it names none)."""
    return _OPERATIONS.get(operation, operation or "chat")


def usage_attributes(usage: Usage) -> dict[str, int]:
    """The ``gen_ai.usage.*`` attributes of ``usage`` (the details only where reported)."""
    out = {
        GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
        GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
    }
    if usage.cached_input_tokens is not None:
        out[GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = usage.cached_input_tokens
    if usage.cache_write_tokens is not None:
        out[GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] = usage.cache_write_tokens
    if usage.reasoning_tokens is not None:
        out[GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] = usage.reasoning_tokens
    return out
