"""The GitHub App and the webhook secrets, as the settings registry describes them.

The client (`runners.github.client`) knows nothing of Django; this module is the wiring:
it reads `github.app_id`, the App's key and `github.api_url` from the registry and keeps one
`GitHubApp` per process, because the App's installation-token cache and its connection pool
are only worth anything when shared. The App is rebuilt when any of those settings, or the
key itself, changes.

The App's key is `github.private_key` (the PEM itself, sealed at rest in the database,
AUTH-07, stored with `manage.py set_secret github.private_key --from-file app.pem`; or
`ZOOMIES_GITHUB_PRIVATE_KEY`) or the file `github.private_key_file` names (or
`ZOOMIES_GITHUB_PRIVATE_KEY_FILE`). When both are set the PEM is used, unless the file comes
from a later layer (CONF-02: a key file in the environment overrides a key in the database).
The cache notices a new key by its SHA-256 or by the key file's identity; the PEM itself is
never part of the cache key.

`github.webhook_secret` (`ZOOMIES_GITHUB_WEBHOOK_SECRET`, or its `_FILE`) is one more webhook
secret, added to `github.webhook_secrets` (a list, so a rotation can hold the old and the new).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from runners.github.client import DEFAULT_BASE_URL, GitHubApp
from zoomies_site.core import registry

log = logging.getLogger("zoomies.github")

DEFAULT_WEBHOOK_MAX_BODY = 25 * 1024 * 1024  # GitHub's cap: a larger event is never sent.

_lock = threading.Lock()
_cached: tuple[tuple, GitHubApp] | None = None


def _setting(key: str, default=None):
    try:
        value = registry.get(key)
    except KeyError:
        return default
    return default if value is None else value


def webhook_secrets() -> list[str]:
    """Every secret a delivery may be signed with (HOOK-01); empty means none configured."""
    configured = _setting("github.webhook_secrets", []) or []
    if isinstance(configured, str):
        configured = [configured]
    secrets = [str(s) for s in configured if s]
    alias = str(_setting("github.webhook_secret", "") or "")
    if alias and alias not in secrets:
        secrets.append(alias)
    return secrets


def webhook_max_body() -> int:
    """The largest delivery the endpoint reads; anything larger is answered 413."""
    value = _setting("github.webhook_max_body", DEFAULT_WEBHOOK_MAX_BODY)
    try:
        return int(value)
    except (TypeError, ValueError):
        return DEFAULT_WEBHOOK_MAX_BODY


def private_key_file() -> str:
    return str(_setting("github.private_key_file", "") or "")


def private_key_pem() -> str:
    """The App's PEM from `github.private_key` (database, sealed; or environment), or ""."""
    return str(_setting("github.private_key", "") or "")


def _pem_outranks_file() -> bool:
    """Whether `github.private_key` comes from the same layer as the key file or a later one."""
    values = registry.current()
    if not values["github.private_key_file"]:
        return True
    rank = registry.SOURCES.index
    return rank(values.source("github.private_key")) >= rank(
        values.source("github.private_key_file")
    )


def _key() -> tuple[tuple, Callable[[], str]] | None:
    """The key's identity for the cache, and how to read the PEM; None if there is none.

    The identity is the PEM's SHA-256 when `github.private_key` is used, so the PEM is not kept
    in the fingerprint, and otherwise the key file's name, mtime, size and inode.
    """
    pem = private_key_pem()
    if pem and _pem_outranks_file():
        return ("setting", hashlib.sha256(pem.encode()).hexdigest()), lambda: pem
    key_file = private_key_file()
    if not key_file:
        return None
    try:
        stat = os.stat(key_file)
    except OSError as exc:
        log.error("the GitHub App private key file %s cannot be read: %s", key_file, exc.strerror)
        return None
    identity = ("file", key_file, stat.st_mtime_ns, stat.st_size, stat.st_ino)
    return identity, lambda: Path(key_file).read_text()


def _fingerprint() -> tuple[tuple, Callable[[], str]] | None:
    """What the App is built from (id, key identity, URL) and the PEM reader; None if unset."""
    app_id = _setting("github.app_id", None)
    if not app_id:
        return None
    key = _key()
    if key is None:
        return None
    identity, read_pem = key
    base_url = str(_setting("github.api_url", "") or DEFAULT_BASE_URL)
    return (int(app_id), identity, base_url), read_pem


def get_app(clock: Callable[[], float] | None = None) -> GitHubApp | None:
    """The process's GitHub App, or None when no App is configured.

    Cached: the same instance comes back until the app id, the API URL or the key changes
    (the `github.private_key` PEM, or the key file's name or the file itself). A replaced App
    is not closed, since another thread may be mid-call on it; its connections go with it.
    `clock` is used only when building one.
    """
    global _cached
    found = _fingerprint()
    if found is None:
        return None
    fingerprint, read_pem = found
    with _lock:
        if _cached is not None and _cached[0] == fingerprint:
            return _cached[1]
        app_id, _identity, base_url = fingerprint
        try:
            pem = read_pem()
            kwargs = {} if clock is None else {"clock": clock}
            app = GitHubApp(app_id, pem, base_url, **kwargs)
        except (OSError, ValueError) as exc:
            # ValueError from the key parser never carries key material (auth.load_private_key).
            log.error("the GitHub App cannot be built: %s", exc)
            return None
        _cached = (fingerprint, app)
        return app


def clear_cache() -> None:
    """Forget the cached App (tests; a settings change is noticed without this)."""
    global _cached
    with _lock:
        _cached = None
