"""The credentials a GitHub App sends (ARCH-10): its JWT and its installation tokens.

The App signs a short JWT with its private key and trades it, per installation, for an
installation token that lasts an hour (GitHub's App authentication). Both are cached, because
minting costs a signature or a call against the App's quota, and each is replaced a margin
before it expires so no request leaves with a credential about to lapse in flight.

No Django, no network: the cache is handed the function that mints a token, and the clock
is injected so tests move time instead of sleeping.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

JWT_BACKDATE = 60  # iat this far in the past: GitHub's advice for clocks that drift.
JWT_LIFETIME = 9 * 60  # exp this far ahead; GitHub refuses anything over 10 minutes.
JWT_REUSE_MARGIN = 60  # Sign a new JWT once the cached one has less than this left.
TOKEN_REFRESH_MARGIN = 5 * 60  # Replace an installation token this long before expires_at.

Clock = Callable[[], float]


def load_private_key(private_key_pem: str | bytes) -> RSAPrivateKey:
    """Parse the App's PEM private key, saying what is wrong without echoing the key."""
    data = private_key_pem.encode() if isinstance(private_key_pem, str) else private_key_pem
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        # `from None`: the parser's own exception is not worth keeping next to key material.
        raise ValueError(
            "the GitHub App private key is not a PEM-encoded, unencrypted private key"
        ) from None
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("the GitHub App private key must be an RSA key (GitHub signs RS256)")
    return key


def mint_app_jwt(app_id: int, private_key: RSAPrivateKey, now: float) -> tuple[str, int]:
    """An App JWT valid from a minute ago for nine minutes; returns it and its exp."""
    issued = int(now) - JWT_BACKDATE
    expires = int(now) + JWT_LIFETIME
    # iss is the numeric App ID as a string: GHES accepts only that, github.com both.
    claims = {"iat": issued, "exp": expires, "iss": str(app_id)}
    return jwt.encode(claims, private_key, algorithm="RS256"), expires


class AppJwt:
    """The App's JWT, signed once and reused until a minute before it expires."""

    def __init__(self, app_id: int, private_key_pem: str | bytes, clock: Clock) -> None:
        self.app_id = int(app_id)
        self._key = load_private_key(private_key_pem)
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0

    def get(self) -> str:
        now = self._clock()
        with self._lock:
            if self._token is None or now >= self._expires - JWT_REUSE_MARGIN:
                self._token, self._expires = mint_app_jwt(self.app_id, self._key, now)
            return self._token

    def __repr__(self) -> str:
        return f"<AppJwt app_id={self.app_id}>"


def parse_github_time(value: str) -> datetime:
    """GitHub's `2016-07-11T22:14:10Z` as an aware datetime."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp without a zone: {value!r}")
    return parsed


@dataclass(frozen=True)
class InstallationToken:
    """An installation access token and when GitHub said it expires (epoch seconds)."""

    token: str = field(repr=False)
    expires_at: float

    def usable(self, now: float) -> bool:
        return now < self.expires_at - TOKEN_REFRESH_MARGIN


class InstallationTokenCache:
    """One live token per installation, shared by every thread.

    A lock per installation means concurrent callers wanting the same installation's first
    token wait for one mint rather than each minting their own, while callers for other
    installations are not held up by it.
    """

    def __init__(self, mint: Callable[[int], InstallationToken], clock: Clock) -> None:
        self._mint = mint
        self._clock = clock
        self._guard = threading.Lock()  # Guards the two dicts, never held across a mint.
        self._locks: dict[int, threading.Lock] = {}
        self._tokens: dict[int, InstallationToken] = {}
        self.mints = 0

    def _lock_for(self, installation_id: int) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(installation_id, threading.Lock())

    def get(self, installation_id: int) -> str:
        """A token with at least TOKEN_REFRESH_MARGIN left, minting one if needed."""
        with self._lock_for(installation_id):
            current = self._tokens.get(installation_id)
            if current is not None and current.usable(self._clock()):
                return current.token
            return self._mint_locked(installation_id)

    def refresh(self, installation_id: int, stale: str) -> str:
        """Replace `stale` after GitHub refused it (401).

        If another thread already replaced it, that replacement is returned instead of
        minting again, so a burst of 401s on one expired token costs one mint.
        """
        with self._lock_for(installation_id):
            current = self._tokens.get(installation_id)
            if current is not None and current.token != stale:
                return current.token
            return self._mint_locked(installation_id)

    def drop(self, installation_id: int) -> None:
        with self._lock_for(installation_id):
            self._tokens.pop(installation_id, None)

    def _mint_locked(self, installation_id: int) -> str:
        # Forget the old token first: if the mint fails, nothing stale is handed out later.
        self._tokens.pop(installation_id, None)
        token = self._mint(installation_id)
        self._tokens[installation_id] = token
        with self._guard:
            self.mints += 1
        return token.token
