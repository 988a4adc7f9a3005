# -*- test-case-name: iop.test.security.test_keys -*-
"""
The key pairs of managed mode, in memory and on disk.

- The **issuer** key is the Edge's lease-signing key: Ed25519. The Edge holds the private half;
  every managed node holds the public half and accepts only leases it signed.
- A **recipient** key is a node's HPKE (RFC 9180) key pair: the Edge seals each lease's secret
  to the node's public half, and only that node's private half opens it. Two KEMs:
  :data:`KEM_X25519` (``"x25519"``, DHKEM(X25519, HKDF-SHA256), the default) and
  :data:`KEM_MLKEM768_X25519` (``"mlkem768-x25519"``, the post-quantum hybrid of ML-KEM-768 and
  X25519).

Files are PEM:

- Ed25519 and X25519 keys: standard PKCS#8 (``PRIVATE KEY``, unencrypted) and SubjectPublicKeyInfo
  (``PUBLIC KEY``), readable by ``openssl pkey``.
- The hybrid key has no standard PEM form, so it has one of its own::

      -----BEGIN IOP MLKEM768-X25519 PRIVATE KEY-----
      base64( ML-KEM-768 seed (64 bytes) || X25519 private key, raw (32 bytes) )
      -----END IOP MLKEM768-X25519 PRIVATE KEY-----

      -----BEGIN IOP MLKEM768-X25519 PUBLIC KEY-----
      base64( ML-KEM-768 encapsulation key, raw (1184 bytes) || X25519 public key, raw (32 bytes) )
      -----END IOP MLKEM768-X25519 PUBLIC KEY-----

A key's :attr:`key_id` is the first 16 hex digits of SHA-256 over its algorithm name
(``ed25519``, ``x25519``, ``mlkem768-x25519``), a zero byte and its raw public bytes: stable,
short, and the same for the private and the public half. It names a key (in leases, logs and
``/status``); it is not a secret and proves nothing on its own.

Private key files are written with mode 0600, atomically (a complete file or none), and never
over an existing file. Every problem with a file raises :class:`KeyFileError`, whose message
names the file and never contains key material; private key objects show no material in their
``repr`` and refuse to be pickled.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import re
import secrets
from typing import NoReturn

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import ed25519, mlkem, x25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

__all__ = [
    "ISSUER_ALGORITHM",
    "KEMS",
    "KEM_MLKEM768_X25519",
    "KEM_X25519",
    "IssuerPublicKey",
    "IssuerSigningKey",
    "KeyFileError",
    "RecipientPrivateKey",
    "RecipientPublicKey",
    "generate_issuer",
    "generate_recipient",
    "load_issuer_private",
    "load_issuer_public",
    "load_recipient_private",
    "load_recipient_public",
    "write_issuer",
    "write_recipient",
]

KEM_X25519 = "x25519"
KEM_MLKEM768_X25519 = "mlkem768-x25519"
#: The recipient key types, the default first.
KEMS = (KEM_X25519, KEM_MLKEM768_X25519)
ISSUER_ALGORITHM = "ed25519"

_HYBRID_PRIVATE_LABEL = "IOP MLKEM768-X25519 PRIVATE KEY"
_HYBRID_PUBLIC_LABEL = "IOP MLKEM768-X25519 PUBLIC KEY"
_MLKEM_SEED_BYTES = 64
_MLKEM768_PUBLIC_BYTES = 1184
_X25519_BYTES = 32
_KEY_ID_HEX = 16
# A key file is small; anything much larger is not one (and is not read whole).
_MAX_KEY_FILE_BYTES = 64 * 1024

_PEM_BLOCK = re.compile(
    rb"-----BEGIN (?P<label>[A-Z0-9 \-]+)-----\r?\n(?P<body>[A-Za-z0-9+/=\r\n]*?)"
    rb"-----END (?P=label)-----"
)


class KeyFileError(Exception):
    """
    A key file could not be read, written or used: missing, unreadable, not a key, a key of
    another kind, or (when writing) already there. The message names the file; it never
    contains key material.
    """


def _key_id(algorithm: str, public_raw: bytes) -> str:
    digest = hashlib.sha256(algorithm.encode("ascii") + b"\0" + public_raw).hexdigest()
    return digest[:_KEY_ID_HEX]


class _NoPickle:
    """Private keys stay in the process: no pickling, no copying into other objects' state."""

    __slots__ = ()

    def __reduce__(self) -> NoReturn:
        raise TypeError(f"{type(self).__name__} cannot be pickled")


# -- issuer (Ed25519) -------------------------------------------------------------------------


class IssuerPublicKey:
    """The public half of the Edge's lease-signing key: verifies lease signatures."""

    __slots__ = ("_key", "_raw", "key_id")

    def __init__(self, key: ed25519.Ed25519PublicKey) -> None:
        self._key = key
        self._raw = key.public_bytes_raw()
        self.key_id = _key_id(ISSUER_ALGORITHM, self._raw)

    def public_bytes_raw(self) -> bytes:
        return self._raw

    def verify(self, signature: bytes, data: bytes) -> bool:
        """True when ``signature`` is this key's Ed25519 signature over exactly ``data``."""
        try:
            self._key.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def to_pem(self) -> bytes:
        return self._key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IssuerPublicKey) and other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)

    def __repr__(self) -> str:
        return f"<IssuerPublicKey {ISSUER_ALGORITHM} key_id={self.key_id}>"


class IssuerSigningKey(_NoPickle):
    """The Edge's lease-signing key (Ed25519 private key)."""

    __slots__ = ("_key", "_public", "key_id")

    def __init__(self, key: ed25519.Ed25519PrivateKey) -> None:
        self._key = key
        self._public = IssuerPublicKey(key.public_key())
        self.key_id = self._public.key_id

    def public_key(self) -> IssuerPublicKey:
        return self._public

    def sign(self, data: bytes) -> bytes:
        """The Ed25519 signature (64 bytes) over exactly ``data``."""
        return self._key.sign(data)

    def to_pem(self) -> bytes:
        return self._key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

    def __repr__(self) -> str:
        return f"<IssuerSigningKey {ISSUER_ALGORITHM} key_id={self.key_id}>"


# -- recipient (HPKE) -------------------------------------------------------------------------

_HPKEPublic = x25519.X25519PublicKey | hpke.MLKEM768X25519PublicKey
_HPKEPrivate = x25519.X25519PrivateKey | hpke.MLKEM768X25519PrivateKey


class RecipientPublicKey:
    """
    The public half of a node's HPKE key: what the Edge seals a lease's secret to.

    :attr:`hpke_key` is what ``cryptography``'s ``hpke.Suite.encrypt`` takes for :attr:`kem`.
    """

    __slots__ = ("_raw", "hpke_key", "kem", "key_id")

    def __init__(self, kem: str, raw: bytes) -> None:
        self.kem = kem
        self._raw = raw
        self.hpke_key: _HPKEPublic
        if kem == KEM_X25519:
            self.hpke_key = x25519.X25519PublicKey.from_public_bytes(raw)
        elif kem == KEM_MLKEM768_X25519:
            if len(raw) != _MLKEM768_PUBLIC_BYTES + _X25519_BYTES:
                raise ValueError(f"a {kem} public key is {_MLKEM768_PUBLIC_BYTES + 32} bytes")
            self.hpke_key = hpke.MLKEM768X25519PublicKey(
                mlkem.MLKEM768PublicKey.from_public_bytes(raw[:_MLKEM768_PUBLIC_BYTES]),
                x25519.X25519PublicKey.from_public_bytes(raw[_MLKEM768_PUBLIC_BYTES:]),
            )
        else:
            raise ValueError(f"unknown KEM {kem!r}; known: {', '.join(KEMS)}")
        self.key_id = _key_id(kem, raw)

    def public_bytes_raw(self) -> bytes:
        """The raw public bytes (for the hybrid: ML-KEM-768 key, then X25519 key)."""
        return self._raw

    def to_pem(self) -> bytes:
        if self.kem == KEM_X25519:
            assert isinstance(self.hpke_key, x25519.X25519PublicKey)
            return self.hpke_key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        return _armour(_HYBRID_PUBLIC_LABEL, self._raw)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RecipientPublicKey)
            and other.kem == self.kem
            and other._raw == self._raw
        )

    def __hash__(self) -> int:
        return hash((self.kem, self._raw))

    def __repr__(self) -> str:
        return f"<RecipientPublicKey {self.kem} key_id={self.key_id}>"


class RecipientPrivateKey(_NoPickle):
    """
    A node's HPKE private key: opens what was sealed to its public half.

    :attr:`hpke_key` is what ``cryptography``'s ``hpke.Suite.decrypt`` takes for :attr:`kem`.
    """

    __slots__ = ("_private_raw", "_public", "hpke_key", "kem", "key_id")

    def __init__(
        self,
        kem: str,
        hpke_key: _HPKEPrivate,
        private_raw: bytes,
        public_raw: bytes,
    ) -> None:
        self.kem = kem
        self.hpke_key = hpke_key
        self._private_raw = private_raw
        self._public = RecipientPublicKey(kem, public_raw)
        self.key_id = self._public.key_id

    @classmethod
    def from_x25519(cls, key: x25519.X25519PrivateKey) -> RecipientPrivateKey:
        return cls(
            KEM_X25519,
            key,
            key.private_bytes_raw(),
            key.public_key().public_bytes_raw(),
        )

    @classmethod
    def from_hybrid(
        cls, mlkem_key: mlkem.MLKEM768PrivateKey, x25519_key: x25519.X25519PrivateKey
    ) -> RecipientPrivateKey:
        return cls(
            KEM_MLKEM768_X25519,
            hpke.MLKEM768X25519PrivateKey(mlkem_key, x25519_key),
            mlkem_key.private_bytes_raw() + x25519_key.private_bytes_raw(),
            mlkem_key.public_key().public_bytes_raw() + x25519_key.public_key().public_bytes_raw(),
        )

    def public_key(self) -> RecipientPublicKey:
        return self._public

    def to_pem(self) -> bytes:
        if self.kem == KEM_X25519:
            assert isinstance(self.hpke_key, x25519.X25519PrivateKey)
            return self.hpke_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        return _armour(_HYBRID_PRIVATE_LABEL, self._private_raw)

    def __repr__(self) -> str:
        return f"<RecipientPrivateKey {self.kem} key_id={self.key_id}>"


# -- generation -------------------------------------------------------------------------------


def generate_issuer() -> IssuerSigningKey:
    """A fresh Ed25519 lease-signing key."""
    return IssuerSigningKey(ed25519.Ed25519PrivateKey.generate())


def generate_recipient(kem: str = KEM_X25519) -> RecipientPrivateKey:
    """A fresh node recipient key of ``kem`` (one of :data:`KEMS`)."""
    if kem == KEM_X25519:
        return RecipientPrivateKey.from_x25519(x25519.X25519PrivateKey.generate())
    if kem == KEM_MLKEM768_X25519:
        return RecipientPrivateKey.from_hybrid(
            mlkem.MLKEM768PrivateKey.generate(), x25519.X25519PrivateKey.generate()
        )
    raise ValueError(f"unknown KEM {kem!r}; known: {', '.join(KEMS)}")


# -- PEM --------------------------------------------------------------------------------------


def _armour(label: str, data: bytes) -> bytes:
    body = base64.encodebytes(data).replace(b"\n", b"")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    begin, end = f"-----BEGIN {label}-----\n".encode(), f"-----END {label}-----\n".encode()
    return b"".join([begin, *(line + b"\n" for line in lines), end])


def _blocks(data: bytes) -> list[tuple[str, bytes]]:
    """The PEM blocks of ``data``: (label, the whole block's bytes)."""
    return [(m.group("label").decode("ascii"), m.group(0)) for m in _PEM_BLOCK.finditer(data)]


def _dearmour(block: bytes) -> bytes:
    match = _PEM_BLOCK.search(block)
    assert match is not None
    return base64.b64decode(b"".join(match.group("body").split()), validate=True)


# -- files ------------------------------------------------------------------------------------


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise KeyFileError(f"cannot read the {what} file {path}: {e.strerror or e}") from None
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"the {what} file {path} is too large to be a key file")
    return data


def _one_block(path: str, what: str, data: bytes) -> tuple[str, bytes]:
    blocks = _blocks(data)
    if not blocks:
        raise KeyFileError(f"the {what} file {path} holds no PEM key")
    if len(blocks) > 1:
        raise KeyFileError(f"the {what} file {path} holds {len(blocks)} PEM blocks; expected one")
    return blocks[0]


def _kind(label: str, obj: object = None) -> str:
    """What a file holds, in words, for an error message."""
    if label in (_HYBRID_PRIVATE_LABEL, _HYBRID_PUBLIC_LABEL):
        half = "private" if "PRIVATE" in label else "public"
        return f"a {KEM_MLKEM768_X25519} {half} key"
    names = {
        ed25519.Ed25519PrivateKey: "an Ed25519 private key (an issuer signing key)",
        ed25519.Ed25519PublicKey: "an Ed25519 public key (an issuer public key)",
        x25519.X25519PrivateKey: f"an {KEM_X25519} private key (a recipient key)",
        x25519.X25519PublicKey: f"an {KEM_X25519} public key (a recipient public key)",
    }
    for cls, name in names.items():
        if isinstance(obj, cls):
            return name
    other = " of another type" if obj is not None else ""
    if "PRIVATE" in label:
        return f"a private key{other}"
    if "PUBLIC" in label:
        return f"a public key{other}"
    return f"a PEM {label!r} block"


def _wrong(path: str, what: str, holds: str) -> NoReturn:
    raise KeyFileError(f"the {what} file {path} holds {holds}, not {what}")


def _standard_private(path: str, what: str, label: str, block: bytes) -> object:
    if label == "ENCRYPTED PRIVATE KEY":
        raise KeyFileError(f"the {what} file {path} is encrypted; IOP reads unencrypted keys")
    if label != "PRIVATE KEY":
        _wrong(path, what, _kind(label))
    try:
        return load_pem_private_key(block, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(f"the {what} file {path} holds no readable private key") from None


def _standard_public(path: str, what: str, label: str, block: bytes) -> object:
    if label != "PUBLIC KEY":
        _wrong(path, what, _kind(label))
    try:
        return load_pem_public_key(block)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(f"the {what} file {path} holds no readable public key") from None


def load_issuer_private(path: str) -> IssuerSigningKey:
    """The Edge's lease-signing key from a PKCS#8 PEM file (Ed25519)."""
    what = "issuer signing key"
    label, block = _one_block(path, what, _read(path, what))
    key = _standard_private(path, what, label, block)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        _wrong(path, what, _kind(label, key))
    return IssuerSigningKey(key)


def load_issuer_public(path: str) -> IssuerPublicKey:
    """The Edge's public signing key from an SPKI PEM file (Ed25519)."""
    what = "issuer public key"
    label, block = _one_block(path, what, _read(path, what))
    key = _standard_public(path, what, label, block)
    if not isinstance(key, ed25519.Ed25519PublicKey):
        _wrong(path, what, _kind(label, key))
    return IssuerPublicKey(key)


def load_recipient_private(path: str) -> RecipientPrivateKey:
    """A node's recipient private key: PKCS#8 X25519, or IOP's ML-KEM-768+X25519 block."""
    what = "recipient private key"
    label, block = _one_block(path, what, _read(path, what))
    if label == _HYBRID_PRIVATE_LABEL:
        try:
            raw = _dearmour(block)
        except (ValueError, binascii.Error):
            raise KeyFileError(f"the {what} file {path} is not valid base64") from None
        if len(raw) != _MLKEM_SEED_BYTES + _X25519_BYTES:
            raise KeyFileError(
                f"the {what} file {path} holds a truncated {KEM_MLKEM768_X25519} key"
            )
        try:
            return RecipientPrivateKey.from_hybrid(
                mlkem.MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED_BYTES]),
                x25519.X25519PrivateKey.from_private_bytes(raw[_MLKEM_SEED_BYTES:]),
            )
        except (ValueError, UnsupportedAlgorithm):
            raise KeyFileError(f"the {what} file {path} holds an unusable key") from None
    key = _standard_private(path, what, label, block)
    if not isinstance(key, x25519.X25519PrivateKey):
        _wrong(path, what, _kind(label, key))
    return RecipientPrivateKey.from_x25519(key)


def load_recipient_public(path: str) -> RecipientPublicKey:
    """A node's recipient public key: SPKI X25519, or IOP's ML-KEM-768+X25519 block."""
    what = "recipient public key"
    label, block = _one_block(path, what, _read(path, what))
    if label == _HYBRID_PUBLIC_LABEL:
        try:
            raw = _dearmour(block)
            return RecipientPublicKey(KEM_MLKEM768_X25519, raw)
        except (ValueError, binascii.Error, UnsupportedAlgorithm):
            raise KeyFileError(
                f"the {what} file {path} holds no valid {KEM_MLKEM768_X25519} public key"
            ) from None
    key = _standard_public(path, what, label, block)
    if not isinstance(key, x25519.X25519PublicKey):
        _wrong(path, what, _kind(label, key))
    return RecipientPublicKey(KEM_X25519, key.public_bytes_raw())


def _write_new(path: str, data: bytes, mode: int) -> None:
    """
    Write ``data`` to a new file ``path`` with ``mode``, atomically, never replacing a file:
    the content goes to a temporary file in the same directory (created 0600, then given
    ``mode``), is synced, and is hard-linked into place (which fails if ``path`` exists).
    """
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise KeyFileError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temporary, path)
    except FileExistsError:
        raise KeyFileError(f"refusing to overwrite the existing file {path}") from None
    except OSError as e:
        raise KeyFileError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def _write_pair(private_pem: bytes, private_path: str, public_pem: bytes, public_path: str) -> None:
    if os.path.abspath(private_path) == os.path.abspath(public_path):
        raise KeyFileError(f"the private and public key files are the same file {private_path}")
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise KeyFileError(f"refusing to overwrite the existing file {path}")
    _write_new(private_path, private_pem, 0o600)
    try:
        _write_new(public_path, public_pem, 0o644)
    except KeyFileError:
        # Never leave half a pair behind.
        os.unlink(private_path)
        raise


def write_issuer(key: IssuerSigningKey, private_path: str, public_path: str) -> None:
    """Write the signing key (0600) and its public half (0644); neither file may exist."""
    _write_pair(key.to_pem(), private_path, key.public_key().to_pem(), public_path)


def write_recipient(key: RecipientPrivateKey, private_path: str, public_path: str) -> None:
    """Write a recipient key (0600) and its public half (0644); neither file may exist."""
    _write_pair(key.to_pem(), private_path, key.public_key().to_pem(), public_path)
