"""Secrets at rest are sealed with AES-256-GCM (AUTH-07)."""

from __future__ import annotations

import base64
import secrets
import stat

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from zoomies_site.core import sealing
from zoomies_site.core.sealing import SealError, key_source, seal, unseal, unseal_text


@pytest.fixture(autouse=True)
def _fresh_key(monkeypatch, settings, tmp_path):
    """No key from the caller's environment, a private data dir, no key cached across tests."""
    monkeypatch.delenv("ZOOMIES_SECRET_KEY", raising=False)
    monkeypatch.delenv("ZOOMIES_SECRET_KEY_FILE", raising=False)
    settings.DATA_DIR = tmp_path / "data"
    sealing.clear_key_cache()
    yield
    sealing.clear_key_cache()


def _use_key(monkeypatch, value: str) -> None:
    monkeypatch.setenv("ZOOMIES_SECRET_KEY", value)


def test_auth07_a_sealed_value_round_trips_and_is_not_the_plaintext(monkeypatch):
    _use_key(monkeypatch, secrets.token_hex(32))
    sealed = seal("-----BEGIN RSA PRIVATE KEY----- app key")
    assert sealed.startswith("v1:")
    assert "PRIVATE" not in sealed
    assert unseal(sealed) == b"-----BEGIN RSA PRIVATE KEY----- app key"
    assert unseal_text(sealed) == "-----BEGIN RSA PRIVATE KEY----- app key"
    assert unseal(seal(b"\x00\xffbytes")) == b"\x00\xffbytes"


def test_auth07_the_format_is_a_nonce_then_aes_256_gcm_with_zoomies_v1_bound(monkeypatch):

    key = secrets.token_bytes(32)
    _use_key(monkeypatch, key.hex())
    blob = base64.urlsafe_b64decode(seal("hello")[3:])
    nonce, body = blob[:12], blob[12:]
    assert len(body) == len(b"hello") + 16
    assert AESGCM(key).decrypt(nonce, body, b"zoomies-v1") == b"hello"


def test_auth07_sealing_twice_gives_different_values(monkeypatch):
    _use_key(monkeypatch, secrets.token_hex(32))
    assert seal("same") != seal("same")


@pytest.mark.parametrize("position", [3, 10, 20, -2])
def test_auth07_a_tampered_value_is_refused_not_returned(monkeypatch, position):
    _use_key(monkeypatch, secrets.token_hex(32))
    sealed = seal("webhook secret")
    flipped = "A" if sealed[position] != "A" else "B"
    tampered = sealed[:position] + flipped + sealed[position + 1 :]
    with pytest.raises(SealError, match="different key or has been altered"):
        unseal(tampered)


@pytest.mark.parametrize(
    "value, message",
    [
        ("plain text", "does not start with 'v1:'"),
        ("v1:***", "not base64"),
        ("v1:" + base64.urlsafe_b64encode(b"short").decode(), "too short"),
    ],
)
def test_auth07_something_that_is_not_a_sealed_value_says_so(monkeypatch, value, message):
    _use_key(monkeypatch, secrets.token_hex(32))
    with pytest.raises(SealError, match=message):
        unseal(value)


def test_auth07_a_wrong_key_raises_a_clear_error_naming_the_key_source(monkeypatch):
    _use_key(monkeypatch, secrets.token_hex(32))
    sealed = seal("token")
    _use_key(monkeypatch, secrets.token_hex(32))
    with pytest.raises(SealError, match="environment variable ZOOMIES_SECRET_KEY"):
        unseal(sealed)


def test_auth07_a_key_file_is_read_and_named(monkeypatch, tmp_path):
    key = secrets.token_bytes(32)
    key_file = tmp_path / "sealing-key"
    key_file.write_text(base64.urlsafe_b64encode(key).decode() + "\n")
    monkeypatch.setenv("ZOOMIES_SECRET_KEY_FILE", str(key_file))
    sealed = seal("from a file")
    assert key_source() == f"file {key_file} named by ZOOMIES_SECRET_KEY_FILE (base64)"
    # The same 32 bytes given as hex in the environment open it: both spell one key.
    monkeypatch.delenv("ZOOMIES_SECRET_KEY_FILE")
    _use_key(monkeypatch, key.hex())
    assert unseal(sealed) == b"from a file"


def test_auth07_the_environment_wins_over_the_file(monkeypatch, tmp_path):
    key_file = tmp_path / "sealing-key"
    key_file.write_text(secrets.token_hex(32))
    monkeypatch.setenv("ZOOMIES_SECRET_KEY_FILE", str(key_file))
    _use_key(monkeypatch, secrets.token_hex(32))
    assert key_source() == "environment variable ZOOMIES_SECRET_KEY (hex)"


def test_auth07_an_unreadable_key_file_is_an_error_not_a_new_key(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOOMIES_SECRET_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(SealError, match="cannot read the sealing key file"):
        seal("x")
    assert not (tmp_path / "data").exists()


def test_auth07_base64_keys_with_or_without_padding_are_the_same_key(monkeypatch):
    key = secrets.token_bytes(32)
    padded = base64.urlsafe_b64encode(key).decode()
    _use_key(monkeypatch, padded)
    sealed = seal("x")
    _use_key(monkeypatch, padded.rstrip("="))
    assert key_source().endswith("(base64)")
    assert unseal(sealed) == b"x"


def test_auth07_anything_else_is_a_passphrase_stretched_with_hkdf(monkeypatch):
    _use_key(monkeypatch, "correct horse battery staple")
    sealed = seal("x")
    assert key_source() == (
        "environment variable ZOOMIES_SECRET_KEY (passphrase, stretched with HKDF-SHA256)"
    )
    sealing.clear_key_cache()
    assert unseal(sealed) == b"x"  # Deterministic: the same passphrase is the same key.
    _use_key(monkeypatch, "correct horse battery stapler")
    with pytest.raises(SealError):
        unseal(sealed)


def test_auth07_without_a_key_one_is_generated_once_with_mode_0600(settings):
    sealed = seal("first")
    key_file = settings.DATA_DIR / "secret-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_source() == f"file {key_file} generated in the data directory (hex)"
    contents = key_file.read_text()
    sealing.clear_key_cache()  # As a restarted process: the file is read, not replaced.
    assert unseal(sealed) == b"first"
    assert key_file.read_text() == contents
    assert [p.name for p in settings.DATA_DIR.iterdir()] == ["secret-key"]


def test_auth07_an_empty_key_is_refused(monkeypatch, tmp_path):
    key_file = tmp_path / "empty"
    key_file.write_text("\n")
    monkeypatch.setenv("ZOOMIES_SECRET_KEY_FILE", str(key_file))
    with pytest.raises(SealError, match="empty"):
        seal("x")
