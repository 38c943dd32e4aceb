"""The App's credentials (ARCH-10): its JWT and the installation-token cache, without HTTP.

The same behaviour over real sockets against the fake GitHub is in test_client.py.
"""

from __future__ import annotations

import threading
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from runners.github.auth import (
    JWT_LIFETIME,
    AppJwt,
    InstallationToken,
    InstallationTokenCache,
    load_private_key,
)


class Clock:
    def __init__(self, now: float = 1_750_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def rsa_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _public(pem: str):
    return load_private_key(pem).public_key()


def test_arch10_the_jwt_is_rs256_issued_a_minute_ago_and_expires_within_ten_minutes(rsa_pem):
    clock = Clock()
    token = AppJwt(12345, rsa_pem, clock).get()
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    claims = jwt.decode(
        token,
        _public(rsa_pem),
        algorithms=["RS256"],
        options={"verify_exp": False, "verify_iat": False},
    )
    assert claims["iss"] == "12345"
    assert claims["iat"] == int(clock.now) - 60
    assert 0 < claims["exp"] - clock.now <= 10 * 60
    assert claims["exp"] == int(clock.now) + JWT_LIFETIME


def test_arch10_the_jwt_is_reused_until_a_minute_before_it_expires(rsa_pem):
    clock = Clock()
    app_jwt = AppJwt(1, rsa_pem, clock)
    first = app_jwt.get()
    clock.now += JWT_LIFETIME - 61
    assert app_jwt.get() == first
    clock.now += 1
    second = app_jwt.get()
    assert second != first
    assert jwt.decode(second, options={"verify_signature": False})["iat"] == int(clock.now) - 60


def test_a_private_key_that_is_not_rsa_pem_is_refused_without_echoing_it():
    with pytest.raises(ValueError, match="not a PEM-encoded") as excinfo:
        AppJwt(1, "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----", time.time)
    assert "c2VjcmV0" not in str(excinfo.value)
    ec_pem = (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    with pytest.raises(ValueError, match="RSA"):
        AppJwt(1, ec_pem, time.time)


def test_the_installation_token_repr_hides_the_token():
    assert "ghs_secret" not in repr(InstallationToken("ghs_secret", 0.0))


class Minter:
    """Mints `tok-<installation>-<n>` tokens an hour long, slowly enough to overlap threads."""

    def __init__(self, clock: Clock, delay: float = 0.0) -> None:
        self.clock = clock
        self.delay = delay
        self.minted: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, installation_id: int) -> InstallationToken:
        time.sleep(self.delay)
        with self.lock:
            token = f"tok-{installation_id}-{len(self.minted)}"
            self.minted.append(token)
        return InstallationToken(token, self.clock.now + 3600)


def test_arch10_a_token_is_reused_until_five_minutes_before_it_expires():
    clock = Clock()
    minter = Minter(clock)
    cache = InstallationTokenCache(minter, clock)
    first = cache.get(7)
    clock.now += 3600 - 301
    assert cache.get(7) == first
    clock.now += 1
    assert cache.get(7) != first
    assert len(minter.minted) == 2 == cache.mints


def test_arch10_eight_threads_wanting_one_installation_get_one_token():
    clock = Clock()
    minter = Minter(clock, delay=0.05)
    cache = InstallationTokenCache(minter, clock)
    barrier = threading.Barrier(8)
    seen: list[str] = []

    def worker() -> None:
        barrier.wait()
        seen.append(cache.get(7))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert minter.minted == ["tok-7-0"]
    assert seen == ["tok-7-0"] * 8


def test_installations_do_not_wait_for_each_others_mints():
    clock = Clock()
    release = threading.Event()

    def mint(installation_id: int) -> InstallationToken:
        if installation_id == 1:
            release.wait(5)
        return InstallationToken(f"tok-{installation_id}", clock.now + 3600)

    cache = InstallationTokenCache(mint, clock)
    slow = threading.Thread(target=cache.get, args=(1,))
    slow.start()
    try:
        assert cache.get(2) == "tok-2"  # Not held up by installation 1's mint.
    finally:
        release.set()
        slow.join()


def test_a_refused_token_is_replaced_once_however_many_callers_saw_it_refused():
    clock = Clock()
    minter = Minter(clock)
    cache = InstallationTokenCache(minter, clock)
    stale = cache.get(7)
    fresh = cache.refresh(7, stale)
    assert fresh != stale
    assert cache.refresh(7, stale) == fresh  # A second caller with the old token.
    assert len(minter.minted) == 2


def test_a_failed_mint_leaves_no_stale_token_behind():
    clock = Clock()
    calls = {"n": 0}

    def mint(installation_id: int) -> InstallationToken:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("GitHub is down")
        return InstallationToken(f"tok-{calls['n']}", clock.now + 3600)

    cache = InstallationTokenCache(mint, clock)
    stale = cache.get(7)
    with pytest.raises(RuntimeError):
        cache.refresh(7, stale)
    assert cache.get(7) == "tok-3"
