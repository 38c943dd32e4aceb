"""Passphrase encryption of a backup file (BAK-03): scrypt, then AES-256-GCM in chunks.

The file is MAGIC, a length-prefixed JSON header (the KDF's parameters and salt, a check
value, the chunk size, a random nonce prefix), then chunks, each a 4-byte length and its
ciphertext with tag. A chunk's nonce is the prefix, its index and a last-chunk flag, and the
header is every chunk's associated data, so chunks cannot be reordered, dropped, swapped
between files or cut off at a chunk boundary without the decryption failing (the STREAM
construction). Memory stays at one chunk whatever the database's size.

The check value (an HMAC under a second key from the same scrypt output) tells a wrong
passphrase from a damaged file, so each gets its own sentence.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

MAGIC = b"ZOOMIES-BACKUP-ENC1\n"
CHUNK = 1024 * 1024
# scrypt at n=2^15, r=8 costs 32 MiB and about a tenth of a second: once per file.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
_CHECK_LABEL = b"zoomies backup passphrase check"


class CryptoError(Exception):
    """A file that cannot be decrypted, said in a sentence (no traceback for an operator)."""


class WrongPassphrase(CryptoError):
    pass


def is_encrypted(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(len(MAGIC)) == MAGIC


def _keys(passphrase: str, salt: bytes, n: int, r: int, p: int) -> tuple[bytes, bytes]:
    if not passphrase:
        raise CryptoError("an empty passphrase encrypts nothing; give one")
    material = Scrypt(salt=salt, length=64, n=n, r=r, p=p).derive(passphrase.encode())
    return material[:32], material[32:]


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    return prefix + struct.pack(">IB", index, 1 if last else 0)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encrypt_file(
    source: Path,
    target: Path,
    passphrase: str,
    *,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write `source` encrypted under `passphrase` to `target` (which must not exist)."""
    salt, prefix = os.urandom(16), os.urandom(7)
    key, check_key = _keys(passphrase, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    header = json.dumps(
        {
            "kdf": "scrypt",
            "n": SCRYPT_N,
            "r": SCRYPT_R,
            "p": SCRYPT_P,
            "salt": _b64(salt),
            "cipher": "AES-256-GCM",
            "chunk": CHUNK,
            "nonce_prefix": _b64(prefix),
            "check": _b64(hmac.new(check_key, _CHECK_LABEL, hashlib.sha256).digest()),
        },
        sort_keys=True,
    ).encode()
    aad = MAGIC + header
    aes = AESGCM(key)
    with open(source, "rb") as plain, open(target, "xb") as out:
        out.write(MAGIC + struct.pack(">I", len(header)) + header)
        index = 0
        current = plain.read(CHUNK)
        while True:
            following = plain.read(CHUNK)
            last = not following
            sealed = aes.encrypt(_nonce(prefix, index, last), current, aad)
            out.write(struct.pack(">I", len(sealed)) + sealed)
            if progress:
                progress(len(current))
            if last:
                break
            current, index = following, index + 1
        out.flush()
        os.fsync(out.fileno())


def _read_exact(handle: BinaryIO, size: int) -> bytes:
    data = handle.read(size)
    if len(data) != size:
        raise CryptoError("the encrypted file is cut short: it was damaged or not fully copied")
    return data


def decrypt_file(
    source: Path,
    target: Path,
    passphrase: str,
    *,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write `source` decrypted to `target`; CryptoError (or WrongPassphrase) says why not.

    A partly written `target` is removed on failure, so no half-decrypted database remains.
    """
    out = open(target, "xb")  # an existing target is refused before anything is written
    try:
        with open(source, "rb") as handle, out:
            if handle.read(len(MAGIC)) != MAGIC:
                raise CryptoError(f"{source.name} is not an encrypted Zoomies backup")
            (length,) = struct.unpack(">I", _read_exact(handle, 4))
            if length > 64 * 1024:
                raise CryptoError("the encrypted file's header is damaged")
            header_bytes = _read_exact(handle, length)
            try:
                header = json.loads(header_bytes)
                salt = base64.b64decode(header["salt"])
                prefix = base64.b64decode(header["nonce_prefix"])
                check = base64.b64decode(header["check"])
                params = int(header["n"]), int(header["r"]), int(header["p"])
                chunk = int(header["chunk"])
            except (ValueError, KeyError, TypeError):
                raise CryptoError("the encrypted file's header is damaged") from None
            if header.get("kdf") != "scrypt" or header.get("cipher") != "AES-256-GCM":
                raise CryptoError("the file was encrypted with a scheme this version cannot read")
            key, check_key = _keys(passphrase, salt, *params)
            expected = hmac.new(check_key, _CHECK_LABEL, hashlib.sha256).digest()
            if not hmac.compare_digest(check, expected):
                raise WrongPassphrase("the passphrase is wrong for this backup")
            aes, aad, index = AESGCM(key), MAGIC + header_bytes, 0
            while True:
                raw = handle.read(4)
                if not raw:
                    raise CryptoError(
                        "the encrypted file is cut short: it was damaged or not fully copied"
                    )
                if len(raw) < 4:
                    raw += _read_exact(handle, 4 - len(raw))
                (size,) = struct.unpack(">I", raw)
                if size > chunk + 16:
                    raise CryptoError(f"the encrypted file is damaged (chunk {index} length)")
                sealed = _read_exact(handle, size)
                try:
                    plain = aes.decrypt(_nonce(prefix, index, False), sealed, aad)
                    last = False
                except InvalidTag:
                    try:
                        plain = aes.decrypt(_nonce(prefix, index, True), sealed, aad)
                        last = True
                    except InvalidTag:
                        raise CryptoError(
                            f"the encrypted file is damaged (chunk {index} fails its check)"
                        ) from None
                out.write(plain)
                if progress:
                    progress(len(plain))
                if last:
                    if handle.read(1):
                        raise CryptoError("the encrypted file has data after its last chunk")
                    break
                index += 1
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        target.unlink(missing_ok=True)
        raise
