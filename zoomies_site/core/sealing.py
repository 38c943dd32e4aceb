"""Secrets at rest, sealed with AES-256-GCM (AUTH-07).

A sealed value is ``"v1:" + urlsafe_base64(nonce[12] + ciphertext_and_tag)``, encrypted
with associated data ``b"zoomies-v1"``, so it is printable, fits a text column and says
which format it is. GitHub App private keys, webhook secrets and any other credential the
controller stores go through `seal` before they reach a row.

Where the key comes from, first match wins (`key_source()` names which one was used):

1. ``ZOOMIES_SECRET_KEY``: the key itself;
2. ``ZOOMIES_SECRET_KEY_FILE``: a file holding it (a Docker or systemd secret);
3. ``<DATA_DIR>/secret-key``: generated once, at random, with mode 0600, and reused. Back
   it up with the database: a database restored without its key cannot be unsealed.

In 1 and 2 the value is taken as 32 bytes when it is 64 hex characters or URL-safe base64
of 32 bytes (with or without ``=`` padding). Anything else is a passphrase, stretched to 32
bytes with HKDF-SHA256 (surrounding whitespace, such as a file's last newline, is ignored
throughout). HKDF adds no work factor, so a passphrase is only as strong as its
own entropy: prefer ``python -c "import secrets; print(secrets.token_hex(32))"``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from zoomies_site.core import environment

log = logging.getLogger(__name__)

PREFIX = "v1:"
ASSOCIATED_DATA = b"zoomies-v1"  # Binds a sealed value to this format; changes with PREFIX.
NONCE_BYTES = 12  # GCM's standard nonce; random per seal.
TAG_BYTES = 16
KEY_BYTES = 32  # AES-256.
KEY_ENV = "ZOOMIES_SECRET_KEY"
KEY_FILE_ENV = "ZOOMIES_SECRET_KEY_FILE"
GENERATED_KEY_NAME = "secret-key"
# Fixed salt and info for the passphrase path: changing either changes every derived key.
_HKDF_SALT = b"zoomies-sealing-salt-v1"
_HKDF_INFO = b"zoomies-v1 sealing key"
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")


class SealError(Exception):
    """A value cannot be sealed or unsealed: no usable key, wrong key, or altered data."""


@dataclass(frozen=True)
class _Key:
    key: bytes
    source: str


_cache: dict[tuple[str, str, str | None], _Key] = {}
_cache_lock = threading.Lock()


def _parse_key(raw: bytes, where: str) -> _Key:
    """32 bytes from hex or URL-safe base64, or else a passphrase stretched with HKDF."""
    value = raw.strip()
    if not value:
        raise SealError(f"the sealing key from {where} is empty")
    text = value.decode("ascii", errors="replace")
    if _HEX_KEY.fullmatch(text):
        return _Key(bytes.fromhex(text), f"{where} (hex)")
    try:
        decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) == KEY_BYTES and re.fullmatch(r"[A-Za-z0-9_-]+={0,2}", text):
        return _Key(decoded, f"{where} (base64)")
    stretched = HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=_HKDF_SALT, info=_HKDF_INFO
    ).derive(value)
    return _Key(stretched, f"{where} (passphrase, stretched with HKDF-SHA256)")


def _generated_key(data_dir: Path) -> _Key:
    """Read `<data_dir>/secret-key`, creating it once if it is not there."""
    path = data_dir / GENERATED_KEY_NAME
    try:
        return _parse_key(path.read_bytes(), f"file {path} generated in the data directory")
    except FileNotFoundError:
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
    # Written to a private temporary file and linked into place, so a second process
    # racing this one either wins the link or reads the winner's complete key, and no
    # one ever reads a half-written file or one that was world-readable for a moment.
    temporary = data_dir / f".{GENERATED_KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(KEY_BYTES) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
            log.warning("sealing: generated a new secret key at %s; back it up", path)
        except FileExistsError:
            pass
    finally:
        temporary.unlink(missing_ok=True)
    return _parse_key(path.read_bytes(), f"file {path} generated in the data directory")


def _data_dir() -> Path:
    from django.conf import settings  # noqa: PLC0415  # Lazy: the module must import without Django set up.

    return Path(settings.DATA_DIR)


def _load_key() -> _Key:
    try:
        found = environment.lookup(KEY_ENV)
    except OSError as exc:
        raise SealError(
            f"cannot read the sealing key file {exc.filename} named by {KEY_FILE_ENV}: "
            f"{exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise SealError(f"the sealing key file named by {KEY_FILE_ENV} is not text") from None
    data_dir = None if found else str(_data_dir())
    # Keyed by the text itself: a rotated key file is a new entry, not a stale hit.
    cache_key = (found.source, found.text, data_dir)
    with _cache_lock:
        cached = _cache.get(cache_key)
        if cached is not None:
            return cached
        if found.source == KEY_ENV:
            loaded = _parse_key(found.text.encode(), f"environment variable {KEY_ENV}")
        elif found:
            where = f"file {found.path} named by {KEY_FILE_ENV}"
            loaded = _parse_key(found.text.encode(), where)
        else:
            assert data_dir is not None  # noqa: S101  # narrows the type; the code above guarantees it
            loaded = _generated_key(Path(data_dir))
        _cache[cache_key] = loaded
        return loaded


def key_source() -> str:
    """Where the sealing key came from, for the Settings page and error messages."""
    return _load_key().source


def seal(plaintext: str | bytes) -> str:
    """Encrypt `plaintext` (a str is UTF-8) into a printable `v1:` value."""
    data = plaintext.encode() if isinstance(plaintext, str) else bytes(plaintext)
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = AESGCM(_load_key().key).encrypt(nonce, data, ASSOCIATED_DATA)
    return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")


def unseal(sealed: str) -> bytes:
    """The plaintext of a `seal` value; SealError for anything else, never garbage."""
    if not isinstance(sealed, str) or not sealed.startswith(PREFIX):
        raise SealError(f"not a sealed value: it does not start with {PREFIX!r}")
    body = sealed[len(PREFIX) :]
    try:
        # validate=True: the lenient decoder would skip stray characters and carry on.
        blob = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise SealError("not a sealed value: the text after 'v1:' is not base64") from None
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise SealError("not a sealed value: too short to hold a nonce and a tag")
    key = _load_key()
    try:
        return AESGCM(key.key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], ASSOCIATED_DATA)
    except InvalidTag:
        raise SealError(
            "cannot unseal: the value was sealed with a different key or has been altered "
            f"(the key in use is from {key.source})"
        ) from None


def unseal_text(sealed: str) -> str:
    """`unseal` for a value that was sealed from a str."""
    try:
        return unseal(sealed).decode()
    except UnicodeDecodeError:
        raise SealError("the unsealed value is not UTF-8 text") from None


def clear_key_cache() -> None:
    """Forget the loaded keys (tests, or after replacing the key generated in the data dir)."""
    with _cache_lock:
        _cache.clear()
