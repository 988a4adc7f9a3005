# -*- test-case-name: iop.test.security.test_keys -*-
"""
Tests for L{iop.security.keys}: generation, key ids, PEM files (modes, atomic no-overwrite
writes, wrong kinds refused with the file named), and nothing secret in a C{repr}.
"""

from __future__ import annotations

import os
import pickle
import stat
import subprocess

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from twisted.trial.unittest import SynchronousTestCase

from iop.security import keys
from iop.security.keys import (
    KEM_MLKEM768_X25519,
    KEM_X25519,
    KEMS,
    IssuerSigningKey,
    KeyFileError,
    RecipientPrivateKey,
    generate_issuer,
    generate_recipient,
    load_issuer_private,
    load_issuer_public,
    load_recipient_private,
    load_recipient_public,
    write_issuer,
    write_recipient,
)


class GenerateTests(SynchronousTestCase):
    def test_kems(self) -> None:
        self.assertEqual(KEMS, ("x25519", "mlkem768-x25519"))
        self.assertEqual(KEMS[0], KEM_X25519)

    def test_default_recipient_is_x25519(self) -> None:
        self.assertEqual(generate_recipient().kem, KEM_X25519)

    def test_unknown_kem(self) -> None:
        with self.assertRaises(ValueError):
            generate_recipient("rsa")

    def test_key_ids(self) -> None:
        """Short hex, the same for both halves, different for different keys and kems."""
        issuer = generate_issuer()
        self.assertRegex(issuer.key_id, r"^[0-9a-f]{16}$")
        self.assertEqual(issuer.public_key().key_id, issuer.key_id)
        self.assertNotEqual(generate_issuer().key_id, issuer.key_id)
        for kem in KEMS:
            recipient = generate_recipient(kem)
            self.assertRegex(recipient.key_id, r"^[0-9a-f]{16}$")
            self.assertEqual(recipient.public_key().key_id, recipient.key_id)
            self.assertEqual(recipient.public_key().kem, kem)

    def test_key_id_covers_the_kem(self) -> None:
        """The same raw bytes under another algorithm name have another id."""
        raw = generate_recipient().public_key().public_bytes_raw()
        self.assertNotEqual(keys._key_id("x25519", raw), keys._key_id("ed25519", raw))

    def test_repr_reveals_no_material(self) -> None:
        issuer = generate_issuer()
        every: list[IssuerSigningKey | RecipientPrivateKey] = [issuer]
        every += [generate_recipient(kem) for kem in KEMS]
        for key in every:
            text = repr(key)
            self.assertIn(key.key_id, text)
            pem = key.to_pem()
            body = b"".join(pem.splitlines()[1:-1]).decode()
            for i in range(0, len(body) - 8, 8):
                self.assertNotIn(body[i : i + 8], text)
            self.assertLess(len(text), 80)

    def test_private_keys_do_not_pickle(self) -> None:
        for key in [
            generate_issuer(),
            generate_recipient(),
            generate_recipient(KEM_MLKEM768_X25519),
        ]:
            with self.assertRaises(TypeError):
                pickle.dumps(key)

    def test_sign_verify(self) -> None:
        issuer = generate_issuer()
        signature = issuer.sign(b"data")
        self.assertTrue(issuer.public_key().verify(signature, b"data"))
        self.assertFalse(issuer.public_key().verify(signature, b"datA"))
        self.assertFalse(generate_issuer().public_key().verify(signature, b"data"))


class FileTests(SynchronousTestCase):
    def directory(self) -> str:
        path = str(self.mktemp())
        os.makedirs(path)
        return path

    def pair(self, name: str) -> tuple[str, str]:
        directory = self.directory()
        return os.path.join(directory, f"{name}.key"), os.path.join(directory, f"{name}.pub")

    def assertMode(self, path: str, mode: int) -> None:
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), mode)

    def test_issuer_round_trip(self) -> None:
        private, public = self.pair("issuer")
        key = generate_issuer()
        write_issuer(key, private, public)
        self.assertMode(private, 0o600)
        self.assertMode(public, 0o644)
        loaded = load_issuer_private(private)
        self.assertEqual(loaded.key_id, key.key_id)
        self.assertEqual(load_issuer_public(public), key.public_key())
        self.assertTrue(load_issuer_public(public).verify(loaded.sign(b"x"), b"x"))
        with open(private, "rb") as f:
            self.assertTrue(f.read().startswith(b"-----BEGIN PRIVATE KEY-----\n"))
        with open(public, "rb") as f:
            self.assertTrue(f.read().startswith(b"-----BEGIN PUBLIC KEY-----\n"))

    def test_recipient_round_trip_both_kems(self) -> None:
        for kem in KEMS:
            private, public = self.pair(kem)
            key = generate_recipient(kem)
            write_recipient(key, private, public)
            self.assertMode(private, 0o600)
            self.assertMode(public, 0o644)
            loaded = load_recipient_private(private)
            self.assertEqual((loaded.kem, loaded.key_id), (kem, key.key_id))
            self.assertEqual(loaded.public_key(), key.public_key())
            self.assertEqual(load_recipient_public(public), key.public_key())

    def test_hybrid_pem_layout(self) -> None:
        private, public = self.pair("hybrid")
        key = generate_recipient(KEM_MLKEM768_X25519)
        write_recipient(key, private, public)
        with open(private, "rb") as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], b"-----BEGIN IOP MLKEM768-X25519 PRIVATE KEY-----")
        self.assertEqual(lines[-1], b"-----END IOP MLKEM768-X25519 PRIVATE KEY-----")
        self.assertEqual(len(keys._dearmour(b"\n".join(lines))), 64 + 32)
        self.assertTrue(all(len(line) <= 64 for line in lines[1:-1]))
        with open(public, "rb") as f:
            self.assertEqual(len(keys._dearmour(f.read())), 1184 + 32)

    def test_standard_files_are_openssl_readable(self) -> None:
        """X25519 and Ed25519 files are plain PKCS#8/SPKI (as ``openssl pkey`` reads them)."""
        private, public = self.pair("x")
        write_recipient(generate_recipient(), private, public)
        try:
            out = subprocess.run(
                ["openssl", "pkey", "-in", private, "-noout", "-text"],
                capture_output=True,
                check=False,
            )
        except FileNotFoundError:
            return
        self.assertEqual(out.returncode, 0)
        self.assertIn(b"X25519", out.stdout)

    def test_refuses_to_overwrite(self) -> None:
        private, public = self.pair("issuer")
        write_issuer(generate_issuer(), private, public)
        with open(private, "rb") as f:
            before = f.read()
        for args in [(private, public + ".2"), (private + ".2", public)]:
            with self.assertRaises(KeyFileError) as caught:
                write_issuer(generate_issuer(), *args)
            self.assertIn("refusing to overwrite", str(caught.exception))
            # Neither half of the refused pair was written.
            self.assertFalse(os.path.exists(private + ".2"))
            self.assertFalse(os.path.exists(public + ".2"))
        with open(private, "rb") as f:
            self.assertEqual(f.read(), before)

    def test_refuses_to_overwrite_a_symlink(self) -> None:
        private, public = self.pair("r")
        os.symlink(private + ".target", private)
        with self.assertRaises(KeyFileError):
            write_recipient(generate_recipient(), private, public)
        self.assertFalse(os.path.exists(private + ".target"))
        self.assertFalse(os.path.exists(public))

    def test_same_file_twice(self) -> None:
        private, _ = self.pair("r")
        with self.assertRaises(KeyFileError):
            write_recipient(generate_recipient(), private, private)

    def test_no_temporary_left_behind(self) -> None:
        private, public = self.pair("r")
        write_recipient(generate_recipient(), private, public)
        self.assertEqual(sorted(os.listdir(os.path.dirname(private))), ["r.key", "r.pub"])

    def test_missing_directory(self) -> None:
        private = os.path.join(self.mktemp(), "nope", "r.key")
        with self.assertRaises(KeyFileError) as caught:
            write_recipient(generate_recipient(), private, private + ".pub")
        self.assertIn(private, str(caught.exception))

    def test_half_written_pair_is_removed(self) -> None:
        """The public file cannot be written: the private one written just before is removed."""
        directory = self.directory()
        private = os.path.join(directory, "r.key")
        public = os.path.join(directory, "missing", "r.pub")
        with self.assertRaises(KeyFileError):
            write_recipient(generate_recipient(), private, public)
        self.assertEqual(os.listdir(directory), [])

    def test_private_mode_despite_umask(self) -> None:
        old = os.umask(0)
        try:
            private, public = self.pair("r")
            write_recipient(generate_recipient(), private, public)
        finally:
            os.umask(old)
        self.assertMode(private, 0o600)

    def written(self) -> dict[str, str]:
        """One file of each kind, by name."""
        issuer, recipient, hybrid = (
            generate_issuer(),
            generate_recipient(),
            generate_recipient(KEM_MLKEM768_X25519),
        )
        directory = self.directory()
        files = {
            name: os.path.join(directory, name)
            for name in ("issuer.key", "issuer.pub", "x.key", "x.pub", "h.key", "h.pub")
        }
        write_issuer(issuer, files["issuer.key"], files["issuer.pub"])
        write_recipient(recipient, files["x.key"], files["x.pub"])
        write_recipient(hybrid, files["h.key"], files["h.pub"])
        return files

    def test_wrong_kind_refused_naming_the_file(self) -> None:
        files = self.written()
        loaders = {
            load_issuer_private: {"issuer.key"},
            load_issuer_public: {"issuer.pub"},
            load_recipient_private: {"x.key", "h.key"},
            load_recipient_public: {"x.pub", "h.pub"},
        }
        for loader, accepted in loaders.items():
            for name, path in files.items():
                if name in accepted:
                    loader(path)
                    continue
                with self.assertRaises(KeyFileError, msg=f"{loader.__name__}({name})") as caught:
                    loader(path)
                message = str(caught.exception)
                self.assertIn(path, message)
                self.assertIn("holds", message)

    def test_errors_never_contain_material(self) -> None:
        files = self.written()
        bodies = []
        for path in files.values():
            with open(path, "rb") as f:
                bodies.append(b"".join(f.read().splitlines()[1:-1]).decode())
        for loader in (load_issuer_public, load_recipient_public):
            for path in files.values():
                try:
                    loader(path)
                except KeyFileError as e:
                    for body in bodies:
                        for i in range(0, len(body) - 12, 12):
                            self.assertNotIn(body[i : i + 12], str(e))

    def write(self, data: bytes) -> str:
        path = os.path.join(self.directory(), "k.pem")
        with open(path, "wb") as f:
            f.write(data)
        return path

    def test_missing_file(self) -> None:
        path = os.path.join(self.directory(), "absent.key")
        for loader in (
            load_issuer_private,
            load_issuer_public,
            load_recipient_private,
            load_recipient_public,
        ):
            with self.assertRaises(KeyFileError) as caught:
                loader(path)
            self.assertIn(path, str(caught.exception))
            self.assertIn("cannot read", str(caught.exception))

    def test_not_pem(self) -> None:
        path = self.write(b"hello\n")
        with self.assertRaises(KeyFileError) as caught:
            load_recipient_private(path)
        self.assertIn("no PEM", str(caught.exception))

    def test_two_blocks(self) -> None:
        pem = generate_issuer().to_pem()
        path = self.write(pem + pem)
        with self.assertRaises(KeyFileError) as caught:
            load_issuer_private(path)
        self.assertIn("2 PEM blocks", str(caught.exception))

    def test_corrupt_hybrid(self) -> None:
        pem = generate_recipient(KEM_MLKEM768_X25519).to_pem().splitlines()
        truncated = b"\n".join([pem[0], pem[1], pem[-1]]) + b"\n"
        for data in [truncated, b"\n".join([pem[0], b"!!!!", pem[-1]])]:
            path = self.write(data)
            with self.assertRaises(KeyFileError) as caught:
                load_recipient_private(path)
            self.assertIn(path, str(caught.exception))
        public = generate_recipient(KEM_MLKEM768_X25519).public_key().to_pem().splitlines()
        path = self.write(b"\n".join([public[0], public[1], public[-1]]) + b"\n")
        with self.assertRaises(KeyFileError):
            load_recipient_public(path)

    def test_encrypted_key(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        path = self.write(
            key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pw"))
        )
        with self.assertRaises(KeyFileError) as caught:
            load_issuer_private(path)
        self.assertIn("encrypted", str(caught.exception))

    def test_other_algorithm(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        private = self.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
        with self.assertRaises(KeyFileError) as caught:
            load_recipient_private(private)
        self.assertIn("another type", str(caught.exception))
        public = self.write(
            key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
        with self.assertRaises(KeyFileError):
            load_issuer_public(public)

    def test_too_large(self) -> None:
        path = self.write(b"x" * (keys._MAX_KEY_FILE_BYTES + 1))
        with self.assertRaises(KeyFileError) as caught:
            load_issuer_public(path)
        self.assertIn("too large", str(caught.exception))
