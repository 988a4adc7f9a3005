# -*- test-case-name: iop.test.config.test_join -*-
"""
The join string: everything a node needs to join its Edge, in one word an operator pastes.

``iop token new NODE_ID --edge HOST:PORT`` and ``iop node add NODE_ID`` print it;
``twistd -n iop-node --join '<string>'`` reads it (:func:`iop.config.node.node_config_from_flags`).
It carries the Edge's node address(es) (``listen.nodes`` as nodes dial it), the node's token,
the pin of the Edge's CA (``sha256:<hex>``, the SHA-256 of the CA certificate's
SubjectPublicKeyInfo, as ``kubeadm join --discovery-token-ca-cert-hash`` does) and, when it is
not :data:`DEFAULT_SERVER_NAME`, the workload name the Edge's certificate carries.

The format is ``iop1.`` followed by the unpadded base64url of a compact JSON object::

    iop1.eyJlZGdlcyI6WyJlZGdlLmV4YW1wbGUubmV0Ojc0NDMiXSwidG9rZW4iOiIuLi4iLCJjYSI6InNoYTI1NjouLi4ifQ

Why this shape rather than a URL (``iop://TOKEN@HOST:PORT?ca=...``): the whole string is letters,
digits, ``.``, ``_`` and ``-``, so no shell splits, globs or backgrounds it, quoted or not (a URL
brings ``?``, ``&`` and ``[]`` with every IPv6 literal); the ``iop1.`` prefix versions it (a later
format is ``iop2.``, and an old node names the version it does not read); and JSON lets it carry
several Edges and grow optional fields without a grammar. It is not meant to be read: the
commands that print it show what it holds beside it, and the node logs what it decoded (never the
token).

The string holds the node's token, so it is a secret: it goes to stdout or a 0600 file, never a
log. :class:`JoinStringError` messages never quote it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from iop.config.model import DEFAULT_TRUST_DOMAIN

__all__ = [
    "DEFAULT_SERVER_NAME",
    "JOIN_PREFIX",
    "JoinString",
    "JoinStringError",
    "check_pin",
    "decode",
    "encode",
]

#: The version prefix of the join strings this code writes and reads.
JOIN_PREFIX = "iop1."
#: The Edge workload name a node checks unless told otherwise: ``edge.`` and the default trust
#: domain, the name ``iop pki issue-edge edge.iop.internal`` gives the Edge's certificate.
DEFAULT_SERVER_NAME = f"edge.{DEFAULT_TRUST_DOMAIN}"
# The most Edges one join string names (node.yaml's edges: limit).
MAX_JOIN_EDGES = 16
# A join string far longer than any real one is refused before it is decoded.
MAX_JOIN_LENGTH = 8192

_PIN = re.compile(r"sha256:[0-9a-f]{64}\Z")
_OTHER_VERSION = re.compile(r"iop(\d+)\.")
_KEYS = {"edges", "token", "ca", "name"}


class JoinStringError(ValueError):
    """A join string that cannot be read; the message says why and never quotes the string."""


@dataclass(frozen=True)
class JoinString:
    """
    What a join string carries.

    @ivar edges: the Edge's node listener(s) as nodes dial them, ``HOST:PORT`` each.
    @ivar token: the node's token (a secret).
    @ivar ca_pin: ``sha256:<hex>`` of the Edge CA's SubjectPublicKeyInfo.
    @ivar server_name: the Edge's workload name, when it is not :data:`DEFAULT_SERVER_NAME`.
    """

    edges: tuple[str, ...]
    token: str
    ca_pin: str
    server_name: str | None = None

    def __repr__(self) -> str:
        # Never the token: a repr ends up in logs and tracebacks.
        return (
            f"JoinString(edges={self.edges!r}, ca_pin={self.ca_pin!r}, "
            f"server_name={self.server_name!r})"
        )


def check_pin(pin: str) -> str:
    """
    ``pin`` as the canonical ``sha256:<lowercase hex>``; a bare 64-digit hex digest is taken too.

    @raise ValueError: not a SHA-256 pin.
    """
    text = pin.strip().lower()
    if not text.startswith("sha256:"):
        text = f"sha256:{text}"
    if not _PIN.match(text):
        raise ValueError("a CA pin is sha256: followed by 64 hex digits")
    return text


def encode(join: JoinString) -> str:
    """The join string for ``join`` (the fields are checked as :func:`decode` checks them)."""
    document: dict[str, object] = {
        "edges": list(join.edges),
        "token": join.token,
        "ca": check_pin(join.ca_pin),
    }
    if join.server_name is not None and join.server_name != DEFAULT_SERVER_NAME:
        document["name"] = join.server_name
    _check(document)
    raw = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return JOIN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode(text: str) -> JoinString:
    """
    The fields of the join string ``text`` (surrounding whitespace and quotes are forgiven: a
    paste often brings them).

    @raise JoinStringError: not a join string, another version, or a field missing or unusable.
    """
    text = text.strip().strip("'\"").strip()
    if len(text) > MAX_JOIN_LENGTH:
        raise JoinStringError(f"not a join string: {len(text)} characters long")
    if not text.startswith(JOIN_PREFIX):
        other = _OTHER_VERSION.match(text)
        if other:
            raise JoinStringError(
                f"a version {other.group(1)} join string; this node reads version 1 "
                f"({JOIN_PREFIX}...): print the join line with this release's iop"
            )
        raise JoinStringError(
            f"not a join string: it starts with {JOIN_PREFIX} (print one with "
            "`iop node add NODE_ID` or `iop token new NODE_ID --edge HOST:PORT`)"
        )
    body = text[len(JOIN_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        document = json.loads(raw)
    except (binascii.Error, ValueError):
        raise JoinStringError(
            "not a join string: its text after iop1. is damaged (copy the whole line again)"
        ) from None
    _check(document)
    assert isinstance(document, dict)
    return JoinString(
        edges=tuple(document["edges"]),
        token=document["token"],
        ca_pin=document["ca"],
        server_name=document.get("name"),
    )


def _check(document: object) -> None:
    if not isinstance(document, dict):
        raise JoinStringError("not a join string: it does not hold an object")
    unknown = sorted(set(document) - _KEYS)
    if unknown:
        raise JoinStringError(
            f"the join string has fields this node does not know ({', '.join(unknown)}): "
            "is it from a newer iop?"
        )
    edges = document.get("edges")
    if (
        not isinstance(edges, list)
        or not edges
        or not all(isinstance(e, str) and e.strip() for e in edges)
    ):
        raise JoinStringError("the join string names no Edge address (edges)")
    if len(edges) > MAX_JOIN_EDGES:
        raise JoinStringError(f"the join string names {len(edges)} Edges; at most {MAX_JOIN_EDGES}")
    token = document.get("token")
    if not isinstance(token, str) or not token.strip() or any(c.isspace() for c in token):
        raise JoinStringError("the join string holds no usable token")
    pin = document.get("ca")
    if not isinstance(pin, str) or not _PIN.match(pin):
        raise JoinStringError("the join string's CA pin (ca) is not sha256: and 64 hex digits")
    name = document.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise JoinStringError("the join string's server name (name) is empty")


def edge_addresses(edges: Sequence[str]) -> tuple[str, ...]:
    """``edges`` stripped, comma-separated entries split (what ``--edge`` takes)."""
    return tuple(part.strip() for value in edges for part in value.split(",") if part.strip())
