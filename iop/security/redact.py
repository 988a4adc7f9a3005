# -*- test-case-name: iop.test.security.test_redact -*-
"""
Credentials out of text that IOP writes itself.

An upstream may echo a request's credentials in its error body (``"invalid header
Authorization: Bearer sk-…"``). IOP passes a tunnel's bytes through as they are (that is the
contract), but an error message IOP composes — the Edge's own error answers and stream error
events, a node's failure text — goes through :func:`redact_secrets` first, which replaces what
looks like a credential with ``[redacted]``, whoever configured it:

- an HTTP authorization scheme and its value (``Bearer …``, ``Basic …``, ``Token …``);
- the value of a credential-named field in header, query or JSON form (``x-api-key: …``,
  ``api_key=…``, ``"api_key": "…"``, ``access_token``, ``client_secret``, ``password``, …);
- a bare secret-key token (``sk-…``, ``sk-ant-…``, ``sk_live_…``) of 16 characters or more.

A provider that knows its configured secrets also removes them literally (the Node's
``IProvider.redact``); this is the pattern-based rule for text nobody configured. Ordinary text
(``max_tokens must be a positive integer``, ``token limit exceeded``) is left as it is.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_secrets"]

REDACTED = "[redacted]"

# ``Bearer <credential>`` (and the other schemes a credential travels in).
_SCHEME = re.compile(r"\b(Bearer|Basic|Token|Digest)(\s+)[A-Za-z0-9._~+/=\-:]{6,}", re.IGNORECASE)

# A credential-named field followed by ``:`` or ``=`` and its value, quoted or not: header form
# (``x-api-key: v``), query form (``api_key=v``) and JSON form (``"api_key": "v"``).
_NAMES = (
    r"(?:x-)?api[-_]?key|x-goog-api-key|api[-_]?token|access[-_]?token|refresh[-_]?token"
    r"|auth[-_]?token|id[-_]?token|session[-_]?token|client[-_]?secret|secret[-_]?key|secret"
    r"|password|passwd|token|authorization|proxy-authorization|cookie|set-cookie"
)
_FIELD = re.compile(
    r"""(?P<name>["']?\b(?:"""
    + _NAMES
    + r""")\b["']?\s*[:=]\s*)(?P<quote>["'])?(?P<scheme>(?:Bearer|Basic|Token|Digest)\s+)?"""
    + r"""(?P<value>(?(quote)[^"'\r\n]+|[^\s"',;&}\]]+))""",
    re.IGNORECASE,
)

# A bare secret-key token: OpenAI/Anthropic ``sk-…``, Stripe-like ``sk_live_…``, ``rk-``.
_TOKEN = re.compile(r"\b(?:sk|rk|pk)[-_][A-Za-z0-9_\-]{16,}")


def _field(match: re.Match[str]) -> str:
    if match.group("value").startswith(REDACTED[:-1]):
        return match.group(0)
    name, quote, scheme = match.group("name"), match.group("quote"), match.group("scheme")
    return f"{name}{quote or ''}{scheme or ''}{REDACTED}"


def redact_secrets(text: str) -> str:
    """``text`` with every credential-looking value replaced by ``[redacted]``."""
    if not text:
        return text
    text = _SCHEME.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _FIELD.sub(_field, text)
    return _TOKEN.sub(REDACTED, text)
