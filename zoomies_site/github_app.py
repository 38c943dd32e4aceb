"""Creating the GitHub App from the Settings page (ARCH-11, issue 26 item 2), the roof's
wiring of runners/github/manifest.py: the manifest for this controller, a state that ties
GitHub's redirect to the admin who started it, and the App GitHub made stored as settings
(its private key and webhook secret sealed at rest, AUTH-07), all audited.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from accounts import audit
from runners.github import config as github_config
from runners.github import manifest
from zoomies_site import actions
from zoomies_site.core import registry

# GitHub's code lives an hour; a state older than that can only meet a dead code.
STATE_LIFETIME = timedelta(hours=1)
SESSION_KEY = "zoomies.github_app_state"


class AppSetupRefused(Exception):
    """Why the flow cannot start or finish, in words for the operator."""


@dataclass(frozen=True)
class Start:
    """The form the browser posts to GitHub: where, the manifest, and the state to keep."""

    action: str
    manifest_json: str
    state: str


def public_url() -> str:
    url: str = registry.get("server.public_url")
    if not url:
        raise AppSetupRefused(
            "set server.public_url first: GitHub sends this controller's webhooks there and "
            "brings you back to it once the App is made"
        )
    return url


def start(*, name: str, organization: str, session: dict, now: datetime) -> Start:
    """The manifest and a fresh state, remembered in the admin's session."""
    name = (name or "").strip() or "Zoomies runners"
    organization = (organization or "").strip()
    state = secrets.token_urlsafe(24)
    session[SESSION_KEY] = {"state": state, "at": now.isoformat()}
    return Start(
        action=manifest.new_app_url(
            registry.get("github.api_url"), state=state, organization=organization
        ),  # fmt: skip
        manifest_json=manifest.manifest_json(name=name, public_url=public_url()),
        state=state,
    )


def complete(*, code: str, state: str, session: dict, actor: str, now: datetime,
             convert=manifest.convert) -> manifest.ConvertedApp:  # fmt: skip
    """Check the state against the session's, trade the code, store what GitHub made."""
    kept = session.pop(SESSION_KEY, None) or {}
    started = kept.get("at")
    if not state or not secrets.compare_digest(str(kept.get("state", "")), state):
        raise AppSetupRefused(
            "this answer from GitHub is not for a setup started here: start again"
        )
    if started is None or now - datetime.fromisoformat(started) > STATE_LIFETIME:
        raise AppSetupRefused("the setup was started over an hour ago, past the code's life")
    if not code:
        raise AppSetupRefused("GitHub's answer carries no code: start again")
    try:
        app = convert(registry.get("github.api_url"), code)
    except manifest.ConversionFailed as exc:
        raise AppSetupRefused(str(exc)) from exc
    store(app, actor=actor, now=now)
    return app


def store(app: manifest.ConvertedApp, *, actor: str, now: datetime) -> None:
    """The App's id, its private key and its webhook secret as settings (the key and the
    secret sealed); secrets already configured stay valid beside the new one."""
    actions.set_setting("github.app_id", app.app_id, actor=actor)
    actions.set_setting("github.private_key", app.pem, actor=actor)
    if app.webhook_secret:
        kept = [s for s in registry.get("github.webhook_secrets") if s != app.webhook_secret]
        actions.set_setting("github.webhook_secrets", [app.webhook_secret, *kept], actor=actor)
    audit.record(actor=actor, action="github.app.created", target=None, at=now,
                 detail={"app_id": app.app_id, "slug": app.slug})  # fmt: skip
    registry.reload()
    github_config.clear_cache()
