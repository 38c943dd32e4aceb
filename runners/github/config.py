"""The GitHub App and the webhook secrets, as the settings registry describes them.

The client (`runners.github.client`) knows nothing of Django; this module is the wiring:
it reads `github.app_id`, `github.private_key_file` and `github.api_url` from the registry
and keeps one `GitHubApp` per process, because the App's installation-token cache and its
connection pool are only worth anything when shared. The App is rebuilt when any of those
settings, or the key file itself, changes.

Two environment names are accepted besides the registry's own:

* `ZOOMIES_GITHUB_WEBHOOK_SECRET` (singular, or `..._FILE`): one more webhook secret, added
  to `github.webhook_secrets` (a list, so a rotation can hold the old and the new);
* `ZOOMIES_GITHUB_PRIVATE_KEY_FILE`: the App's private key file, when the registry has none.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from runners.github.client import DEFAULT_BASE_URL, GitHubApp

log = logging.getLogger("zoomies.github")

ENV_WEBHOOK_SECRET = "ZOOMIES_GITHUB_WEBHOOK_SECRET"
ENV_PRIVATE_KEY_FILE = "ZOOMIES_GITHUB_PRIVATE_KEY_FILE"
DEFAULT_WEBHOOK_MAX_BODY = 25 * 1024 * 1024  # GitHub never sends more (NOTES.md section 1).

_lock = threading.Lock()
_cached: tuple[tuple, GitHubApp] | None = None


def _setting(key: str, default=None):
    from zoomies_site import registry

    try:
        value = registry.get(key)
    except KeyError:
        return default
    return default if value is None else value


def _env_or_file(name: str) -> str:
    value = os.environ.get(name, "")
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            log.error("%s_FILE names %s, which cannot be read: %s", name, path, exc.strerror)
    return ""


def webhook_secrets() -> list[str]:
    """Every secret a delivery may be signed with (HOOK-01); empty means none configured."""
    configured = _setting("github.webhook_secrets", []) or []
    if isinstance(configured, str):
        configured = [configured]
    secrets = [str(s) for s in configured if s]
    alias = _env_or_file(ENV_WEBHOOK_SECRET)
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
    return str(_setting("github.private_key_file", "") or os.environ.get(ENV_PRIVATE_KEY_FILE, ""))


def _fingerprint() -> tuple | None:
    """What the App is built from, including the key file's identity; None if unconfigured."""
    app_id = _setting("github.app_id", None)
    key_file = private_key_file()
    if not app_id or not key_file:
        return None
    base_url = str(_setting("github.api_url", "") or DEFAULT_BASE_URL)
    try:
        stat = os.stat(key_file)
    except OSError as exc:
        log.error("the GitHub App private key file %s cannot be read: %s", key_file, exc.strerror)
        return None
    return (int(app_id), key_file, stat.st_mtime_ns, stat.st_size, stat.st_ino, base_url)


def get_app(clock: Callable[[], float] | None = None) -> GitHubApp | None:
    """The process's GitHub App, or None when no App is configured.

    Cached: the same instance comes back until the app id, the API URL, the key file's name
    or the key file itself changes. A replaced App is not closed, since another thread may be
    mid-call on it; its connections go with it. `clock` is used only when building one.
    """
    global _cached
    fingerprint = _fingerprint()
    if fingerprint is None:
        return None
    with _lock:
        if _cached is not None and _cached[0] == fingerprint:
            return _cached[1]
        app_id, key_file, _mtime, _size, _ino, base_url = fingerprint
        try:
            pem = Path(key_file).read_text()
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
