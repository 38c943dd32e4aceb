"""A fake GitHub wired to the in-process live server: one org installation (acme/app) and one
pool, for the end-to-end tests that run an agent against Django's live server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runners.github import config as github_config
from runners.github.fake import FakeGitHub
from runners.models import Installation, Pool
from zoomies_site.core import registry


@contextmanager
def fake_github_for(
    live_server_url: str, tmp_path, monkeypatch, *, secret: str, **pool: Any
) -> Iterator[FakeGitHub]:
    """Start the fake, point the controller's GitHub settings at it, create the installation
    and a pool with `pool`'s fields; stop it and forget the settings afterwards."""
    fake = FakeGitHub(
        webhook_url=f"{live_server_url}/webhooks/github", webhook_secret=secret
    ).start()
    key = tmp_path / "app.pem"
    key.write_text(fake.private_key_pem)
    monkeypatch.setenv("ZOOMIES_GITHUB_API_URL", fake.url)
    monkeypatch.setenv("ZOOMIES_GITHUB_APP_ID", str(fake.app_id))
    monkeypatch.setenv("ZOOMIES_GITHUB_PRIVATE_KEY_FILE", str(key))
    monkeypatch.setenv("ZOOMIES_GITHUB_WEBHOOK_SECRETS", secret)
    registry.reload()
    github_config.clear_cache()
    try:
        inst = fake.add_installation(
            account="acme", account_type="Organization", repositories=["acme/app"]
        )
        installation = Installation.objects.create(
            github_id=inst, account="acme", kind="org", repositories=["acme/app"]
        )
        Pool.objects.create(installation=installation, max_runners=2, **pool)
        yield fake
    finally:
        fake.stop()
        registry.reload()
        github_config.clear_cache()
