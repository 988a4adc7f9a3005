# -*- test-case-name: iop.test.config.test_edge_config,iop.test.config.test_node_config -*-
"""
Secret references in configuration: ``${ENV_VAR}`` resolution, ``token_file`` reading and
``token_sha256`` parsing, for node tokens, client keys and provider credentials.

Tracked configuration never holds a credential: a token (or a ``credentials[]`` secret) is given
as a pure ``${ENV_VAR}`` reference, a ``*_file`` path, or (Edge node tokens and client keys
only) the token's sha256 digest. Issues raised here name the config path, the variable or the
file, never a value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from iop.config.errors import MISSING, Issues, Section, type_name
from iop.config.model import NodeToken, Secret

# Token files hold one short line; anything bigger is a mistake (a key, a log file...).
MAX_TOKEN_FILE_BYTES = 64 * 1024

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PURE_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")
# ``$$`` is a literal ``$``; ``${...}`` a reference; a ``${`` without ``}`` is malformed.
_TOKEN = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<name>[^{}]*)\}|(?P<open>\{))")
_HEX64 = re.compile(r"[0-9A-Fa-f]{64}\Z")


def absolute_path(base_dir: str, path: str) -> str:
    """``path`` resolved against ``base_dir`` (a config file's directory), normalized."""
    return os.path.normpath(os.path.join(os.path.abspath(base_dir), path))


def resolve_references(issues: Issues, path: str, text: str, environ: Mapping[str, str]) -> str:
    """
    Replace every ``${NAME}`` in ``text`` with ``environ[NAME]`` (``$$`` is a literal ``$``).
    A missing variable or a malformed reference is an issue at ``path``.
    """
    missing: list[str] = []
    malformed = False

    def replace(match: re.Match[str]) -> str:
        nonlocal malformed
        if match.group("dollar") is not None:
            return "$"
        name = match.group("name")
        if name is None or not _NAME.match(name):
            malformed = True
            return ""
        value = environ.get(name)
        if value is None:
            if name not in missing:
                missing.append(name)
            return ""
        return value

    result = _TOKEN.sub(replace, text)
    for name in missing:
        issues.add(path, f"environment variable {name} is not set (referenced as ${{{name}}})")
    if malformed:
        issues.add(
            path,
            "malformed ${...} reference: write ${NAME} with letters, digits and _ "
            "(or $$ for a literal $)",
        )
    return result


def read_token_file(issues: Issues, path: str, filename: str, kind: str = "token") -> str | None:
    """
    The stripped contents of the token file ``filename``; ``None`` after recording an issue
    at ``path`` if it is missing, unreadable, not text, too large or empty. ``kind`` names
    the file in messages ("token file", "secret file").
    """
    try:
        with open(filename, "rb") as f:
            data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except FileNotFoundError:
        issues.add(path, f"{kind} file {filename} does not exist")
        return None
    except OSError as e:
        issues.add(path, f"cannot read {kind} file {filename}: {e.strerror or e}")
        return None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        issues.add(path, f"{kind} file {filename} is larger than {MAX_TOKEN_FILE_BYTES} bytes")
        return None
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        issues.add(path, f"{kind} file {filename} is not UTF-8 text")
        return None
    if not token:
        issues.add(path, f"{kind} file {filename} is empty")
        return None
    return token


def parse_sha256_hex(issues: Issues, path: str, value: object) -> bytes | None:
    """A sha256 digest given as 64 hex characters (either case)."""
    if not isinstance(value, str):
        issues.add(path, f"must be a string of 64 hex characters, got {type_name(value)}")
        return None
    text = value.strip()
    if not _HEX64.match(text):
        # Not echoed: a token pasted here by mistake must not reach a log.
        issues.add(path, "must be a sha256 digest: exactly 64 hexadecimal characters")
        return None
    return bytes.fromhex(text)


def resolve_token_reference(
    issues: Issues,
    path: str,
    value: object,
    environ: Mapping[str, str],
    hint: str,
    kind: str = "token",
) -> str | None:
    """
    A ``token:`` value, which must be exactly ``${NAME}``; returns the variable's stripped
    value. A literal token is rejected (``hint`` says what to use instead; ``kind`` names
    what it is: "token", "secret").
    """
    if not isinstance(value, str):
        issues.add(path, f"must be a ${{ENV_VAR}} reference string, got {type_name(value)}")
        return None
    match = _PURE_REFERENCE.match(value.strip())
    if match is None:
        issues.add(path, f"literal {kind}s are not allowed in config; {hint}")
        return None
    name = match.group(1)
    token = environ.get(name)
    if token is None:
        issues.add(path, f"environment variable {name} is not set (referenced as ${{{name}}})")
        return None
    token = token.strip()
    if not token:
        issues.add(path, f"environment variable {name} is empty")
        return None
    return token


_EDGE_HINT = "use token: ${ENV_VAR}, token_file or token_sha256"
_NODE_HINT = "use token: ${ENV_VAR} or token_file"
_SECRET_HINT = "use secret: ${ENV_VAR} or secret_file"
# What may not appear in a secret that becomes an HTTP header value (RFC 9110 field-value:
# no control characters but HTAB).
_HEADER_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _one_of(section: Section, keys: tuple[str, ...]) -> str | None:
    """The single token key present in ``section``, or ``None`` after recording an issue."""
    present = [key for key in keys if section.raw(key) is not MISSING]
    if len(present) == 1:
        return present[0]
    names = ", ".join(keys[:-1]) + " or " + keys[-1]
    if not present:
        section.issues.add(section.path, f"one of {names} is required")
    else:
        section.issues.add(section.path, f"set only one of {names} (found: {', '.join(present)})")
    return None


def edge_node_token(
    section: Section, *, base_dir: str, environ: Mapping[str, str], name: str = "token"
) -> NodeToken | None:
    """
    ``nodes[].token`` / ``token_file`` / ``token_sha256`` (exactly one) as the digest-only
    :class:`NodeToken` the Edge keeps. ``name`` renames the family (``key`` / ``key_file`` /
    ``key_sha256`` for client API keys).
    """
    key = _one_of(section, (name, f"{name}_file", f"{name}_sha256"))
    if key is None:
        return None
    path = section.path_of(key)
    value = section.raw(key)
    if key == f"{name}_sha256":
        digest = parse_sha256_hex(section.issues, path, value)
        return None if digest is None else NodeToken(digest)
    hint = _EDGE_HINT.replace("token", name)
    token = _plaintext_token(section, key, value, base_dir, environ, hint, name)
    return None if token is None else NodeToken.from_plaintext(token)


def node_daemon_token(
    section: Section, *, base_dir: str, environ: Mapping[str, str]
) -> Secret | None:
    """node.yaml ``token`` / ``token_file`` (exactly one) as a :class:`Secret`."""
    key = _one_of(section, ("token", "token_file"))
    if key is None:
        return None
    token = _plaintext_token(section, key, section.raw(key), base_dir, environ, _NODE_HINT, "token")
    return None if token is None else Secret(token)


def credential_secret(
    section: Section, *, base_dir: str, environ: Mapping[str, str]
) -> Secret | None:
    """
    ``credentials[].secret`` / ``secret_file`` (exactly one) as a :class:`Secret`: a provider
    credential, which the Edge sends only sealed in a lease, as an HTTP header value (so no
    control characters).
    """
    key = _one_of(section, ("secret", "secret_file"))
    if key is None:
        return None
    secret = _plaintext_token(
        section, key, section.raw(key), base_dir, environ, _SECRET_HINT, "secret", kind="secret"
    )
    if secret is None:
        return None
    if _HEADER_UNSAFE.search(secret):
        section.issues.add(
            section.path_of(key),
            "the secret contains a line break or another control character; it must fit in "
            "one HTTP header value",
        )
        return None
    return Secret(secret)


def _plaintext_token(
    section: Section,
    key: str,
    value: object,
    base_dir: str,
    environ: Mapping[str, str],
    hint: str,
    name: str,
    kind: str = "token",
) -> str | None:
    path = section.path_of(key)
    if key == name:
        return resolve_token_reference(section.issues, path, value, environ, hint, kind)
    if not isinstance(value, str) or not value.strip():
        shown = "empty" if isinstance(value, str) else type_name(value)
        section.issues.add(path, f"must be a file path, got {shown}")
        return None
    return read_token_file(section.issues, path, absolute_path(base_dir, value), kind)
