# -*- test-case-name: iop.test.formats.test_errors -*-
"""
The message an upstream's error body gives, whichever of the usual shapes it has.

One rule (:func:`error_message`), for the Node's adapters and the Edge's ingress alike: the first
non-blank string among ``error.message`` (OpenAI, Anthropic), a string ``error``, a top-level
``message`` (older vLLM ``ErrorResponse``) and ``detail`` (FastAPI). What to say when the body
names no message (its text, or the status) is the caller's choice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["error_message"]


def error_message(body: bytes | str | Mapping[str, Any]) -> str | None:
    """
    The message of an error body (raw bytes or text of a JSON document, or the decoded object),
    unchanged; None when it is not a JSON object or names no message.
    """
    data: Any = body
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except ValueError:
            return None
    if not isinstance(data, Mapping):
        return None
    error = data.get("error")
    candidates = (
        error.get("message") if isinstance(error, Mapping) else error,
        data.get("message"),
        data.get("detail"),
    )
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip():
            return candidate
    return None
