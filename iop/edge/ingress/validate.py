# -*- test-case-name: iop.test.edge.ingress.test_validate -*-
"""
What the Edge checks in a request body before it spends a lease, one function per route.

The body is already a JSON object that re-serializes as JSON (:func:`~.http.read_json`: no lone
surrogates, every number finite, bounded nesting). These checks make sure that the fields the
Edge itself reads, and the shape every provider needs, have the right type and bounds, so a
malformed request is answered ``400`` at once — in the surface's error shape, naming the field
(the OpenAI ``param``; the Anthropic message starts with it) — rather than after it has waited
for a provider, or been forwarded upstream. Fields not listed here, and fields nobody knows, pass
through untouched (the official SDKs, Claude Code and Codex send more than any list).

Every route:

- ``model``: a non-empty string; ``stream``: a boolean (or absent/``null``).
- Output limits (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``) and a thinking
  ``budget_tokens``: integers from 1 to 2**32-1 (what a run carries on the wire).
- Sampling parameters (``temperature``, ``top_p``; on Chat Completions also
  ``presence_penalty``, ``frequency_penalty``): numbers, never booleans (and finite, as every
  number). ``seed`` (Chat Completions) an integer within 64 bits; ``top_k`` (Messages) an
  integer from 0 to 2**32-1.
- ``tools``: a list of objects; ``metadata``: an object.

``POST /v1/chat/completions``: ``messages`` a non-empty list of objects, each with a string
``role``; ``content`` ``null``, a string or a list of content parts (objects with a string
``type``); ``tool_calls`` a list of objects; ``tool_choice`` a string or an object; ``n`` an
integer from 1 to 128; ``stop`` a string or a list of strings; ``stream_options`` an object whose
``include_usage`` is a boolean; ``reasoning_effort`` a string; ``response_format`` an object.

``POST /v1/responses``: ``input`` a string or a list (of strings or objects); ``instructions`` a
string; ``tool_choice`` a string or an object.

``POST /v1/messages`` and ``/v1/messages/count_tokens``: ``messages`` a non-empty list of
objects, each with a string ``role`` and a ``content`` that is a string or a list of content
blocks (objects with a string ``type``); ``system`` a string or a list of blocks;
``tool_choice`` an object with a string ``type``; ``stop_sequences`` a list of strings;
``thinking`` an object with a string ``type``. ``max_tokens`` (messages only) is checked for
bounds here; whether it is required depends on the model's policy (the surface decides).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iop.edge.ingress.errors import ApiError, bad_request

__all__ = [
    "MAX_CHOICES",
    "MAX_TOKENS_LIMIT",
    "check_anthropic_count_tokens",
    "check_anthropic_messages",
    "check_openai_chat",
    "check_openai_responses",
]

# The largest output limit or thinking budget: a run carries them as uint32.
MAX_TOKENS_LIMIT = 2**32 - 1
# The most choices a chat completion may ask for (OpenAI's own bound).
MAX_CHOICES = 128
_INT64 = 2**63

OPENAI_SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
ANTHROPIC_SAMPLING = ("temperature", "top_p")

# How a failing check is worded for a surface: (field path, what it must be) → the error.
Fail = Callable[[str, str], ApiError]


def _openai(param: str, must: str) -> ApiError:
    return bad_request(f"'{param}' must be {must}", param=param)


def _anthropic(param: str, must: str) -> ApiError:
    return bad_request(f"{param}: must be {must}", param=param)


# -- types -------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _present(body: dict[str, Any], name: str) -> bool:
    return body.get(name) is not None


def _bool(body: dict[str, Any], name: str, fail: Fail) -> None:
    if _present(body, name) and not isinstance(body[name], bool):
        raise fail(name, "a boolean")


def _string(body: dict[str, Any], name: str, fail: Fail) -> None:
    if _present(body, name) and not isinstance(body[name], str):
        raise fail(name, "a string")


def _object(body: dict[str, Any], name: str, fail: Fail) -> None:
    if _present(body, name) and not isinstance(body[name], dict):
        raise fail(name, "an object")


def _int_in(value: Any, param: str, low: int, high: int, fail: Fail) -> None:
    if not _is_int(value) or not low <= value <= high:
        raise fail(param, f"an integer in the range {low}..{high}")


def _limit(body: dict[str, Any], name: str, fail: Fail) -> None:
    if _present(body, name):
        _int_in(body[name], name, 1, MAX_TOKENS_LIMIT, fail)


def _numbers(body: dict[str, Any], names: tuple[str, ...], fail: Fail) -> None:
    for name in names:
        if _present(body, name) and not _is_number(body[name]):
            raise fail(name, "a number")


def _list_of_objects(body: dict[str, Any], name: str, fail: Fail) -> None:
    value = body.get(name)
    if value is None:
        return
    if not isinstance(value, list):
        raise fail(name, "a list")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise fail(f"{name}[{i}]", "an object")


def _strings(value: Any, param: str, fail: Fail) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise fail(param, "a list of strings")


def _parts(content: Any, param: str, fail: Fail, *, allow_null: bool) -> None:
    """``content``: a string or a list of parts (objects with a string ``type``)."""
    if content is None and allow_null:
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise fail(param, "a string or a list of content parts")
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise fail(f"{param}[{j}]", "an object")
        if not isinstance(part.get("type"), str):
            raise fail(f"{param}[{j}].type", "a string")


def _messages(body: dict[str, Any], fail: Fail, *, anthropic: bool) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise fail("messages", "a non-empty list")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise fail(where, "an object")
        if not isinstance(message.get("role"), str):
            raise fail(f"{where}.role", "a string")
        if anthropic:
            if "content" not in message:
                raise fail(f"{where}.content", "present")
            _parts(message["content"], f"{where}.content", fail, allow_null=False)
        else:
            _parts(message.get("content"), f"{where}.content", fail, allow_null=True)
            _list_of_objects(message, "tool_calls", _under(where, fail))


def _under(prefix: str, fail: Fail) -> Fail:
    return lambda param, must: fail(f"{prefix}.{param}", must)


def _common(body: dict[str, Any], fail: Fail) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise fail("model", "a non-empty string")
    _bool(body, "stream", fail)
    _list_of_objects(body, "tools", fail)
    _object(body, "metadata", fail)


# -- the routes --------------------------------------------------------------------------------


def check_openai_chat(body: dict[str, Any]) -> None:
    """``POST /v1/chat/completions`` (see the module docstring); raises a 400 :class:`ApiError`."""
    fail = _openai
    _common(body, fail)
    _messages(body, fail, anthropic=False)
    for name in ("max_tokens", "max_completion_tokens"):
        _limit(body, name, fail)
    _numbers(body, OPENAI_SAMPLING, fail)
    if _present(body, "seed"):
        _int_in(body["seed"], "seed", -_INT64, _INT64 - 1, fail)
    if _present(body, "n"):
        _int_in(body["n"], "n", 1, MAX_CHOICES, fail)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        _strings(stop, "stop", fail)
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, str | dict):
        raise fail("tool_choice", "a string or an object")
    _object(body, "stream_options", fail)
    if _present(body, "stream_options"):
        _bool(body["stream_options"], "include_usage", _under("stream_options", fail))
    _string(body, "reasoning_effort", fail)
    _object(body, "response_format", fail)


def check_openai_responses(body: dict[str, Any]) -> None:
    """``POST /v1/responses`` (see the module docstring); raises a 400 :class:`ApiError`."""
    fail = _openai
    _common(body, fail)
    inputs = body.get("input")
    if inputs is not None:
        if not isinstance(inputs, str | list):
            raise fail("input", "a string or a list of items")
        if isinstance(inputs, list):
            for i, item in enumerate(inputs):
                if not isinstance(item, str | dict):
                    raise fail(f"input[{i}]", "a string or an object")
    _string(body, "instructions", fail)
    _limit(body, "max_output_tokens", fail)
    _numbers(body, ("temperature", "top_p"), fail)
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, str | dict):
        raise fail("tool_choice", "a string or an object")


def _anthropic_common(body: dict[str, Any]) -> None:
    fail = _anthropic
    _common(body, fail)
    _messages(body, fail, anthropic=True)
    system = body.get("system")
    if system is not None:
        _parts(system, "system", fail, allow_null=False)
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict):
            raise fail("tool_choice", "an object")
        if not isinstance(choice.get("type"), str):
            raise fail("tool_choice.type", "a string")
    thinking = body.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict):
            raise fail("thinking", "an object")
        if not isinstance(thinking.get("type"), str):
            raise fail("thinking.type", "a string")
        if thinking.get("budget_tokens") is not None:
            _int_in(thinking["budget_tokens"], "thinking.budget_tokens", 1, MAX_TOKENS_LIMIT, fail)


def check_anthropic_messages(body: dict[str, Any]) -> None:
    """``POST /v1/messages`` (see the module docstring); raises a 400 :class:`ApiError`."""
    fail = _anthropic
    _anthropic_common(body)
    _limit(body, "max_tokens", fail)
    _numbers(body, ANTHROPIC_SAMPLING, fail)
    if _present(body, "top_k"):
        _int_in(body["top_k"], "top_k", 0, MAX_TOKENS_LIMIT, fail)
    if _present(body, "stop_sequences"):
        _strings(body["stop_sequences"], "stop_sequences", fail)


def check_anthropic_count_tokens(body: dict[str, Any]) -> None:
    """``POST /v1/messages/count_tokens`` (see the module docstring); raises a 400."""
    _anthropic_common(body)
