"""ARCH-11 end to end over real HTTP: a fresh install (no App id, no key, no webhook secret)
is set up from the Settings page through the manifest flow against the fake GitHub, then
receives signed webhooks from it, with no secret typed by hand."""

from __future__ import annotations

import html
import io
import re
import time
import urllib.parse

import httpx
import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from runners.github import config as github_config
from runners.github.fake import FakeGitHub
from runners.models import Installation, Job
from tests.accounts.conftest import make_user
from zoomies_site.core import registry
from zoomies_site.core.models import SettingValue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fresh_install(live_server, monkeypatch, registry_defaults):
    """The controller knows only where GitHub is and where it is reached itself."""
    fake = FakeGitHub(webhook_url=None).start()
    for name in ("APP_ID", "PRIVATE_KEY_FILE", "PRIVATE_KEY", "WEBHOOK_SECRETS", "WEBHOOK_SECRET"):
        monkeypatch.delenv(f"ZOOMIES_GITHUB_{name}", raising=False)
    monkeypatch.setenv("ZOOMIES_GITHUB_API_URL", fake.url)
    monkeypatch.setenv("ZOOMIES_SERVER_PUBLIC_URL", live_server.url)
    registry.reload()
    github_config.clear_cache()
    yield fake
    fake.stop()
    registry.reload()
    github_config.clear_cache()


def admin() -> Client:
    client = Client()
    client.force_login(make_user("ada", "admin"))
    return client


def test_arch11_a_fresh_install_is_set_up_from_the_settings_page_and_takes_signed_webhooks(
    fresh_install, live_server
):
    fake, browser = fresh_install, admin()
    assert registry.get("github.app_id") == 0
    assert "Create the GitHub App" in browser.get("/settings").content.decode()

    # The Settings page hands the browser a form that posts the manifest to GitHub.
    page = browser.post("/settings/github-app", {"name": "Zoomies runners", "organization": "acme"})
    assert page.status_code == 200
    text = page.content.decode()
    action = html.unescape(re.search(r'action="([^"]+/settings/apps/new[^"]*)"', text)[1])
    document = html.unescape(re.search(r'name="manifest" value="([^"]+)"', text)[1])
    assert action.startswith(f"{fake.url}/organizations/acme/settings/apps/new?state=")

    # The admin confirms at GitHub, which sends the browser back with the code.
    at_github = httpx.post(action, data={"manifest": document}, follow_redirects=False, timeout=10)
    back = urllib.parse.urlsplit(at_github.headers["Location"])
    assert f"{back.scheme}://{back.netloc}" == live_server.url
    done = browser.get(f"{back.path}?{back.query}", follow=True)
    shown = done.content.decode()
    assert "is set up" in shown and f"{fake.url}/apps/zoomies-runners/installations/new" in shown

    registry.reload()
    assert registry.get("github.app_id") == fake.app_id
    for key in ("github.private_key", "github.webhook_secrets"):
        assert registry.is_sealed(SettingValue.objects.get(key=key).value), key
    assert fake.webhook_secret in registry.get("github.webhook_secrets")

    # The App is installed; GitHub's next delivery is signed with the secret it handed out.
    inst = fake.add_installation(account="acme", repositories=["acme/app"])
    Installation.objects.create(github_id=inst, account="acme", kind="org",
                                repositories=["acme/app"])  # fmt: skip
    job = fake.queue_job(repo="acme/app", labels=["self-hosted", "linux"], duration=60)
    deadline = time.monotonic() + 20
    while not Job.objects.filter(github_id=job).exists():
        assert time.monotonic() < deadline, fake.deliveries
        time.sleep(0.05)
    assert all(200 <= d["status_code"] < 300 for d in fake.deliveries), fake.deliveries


def test_arch11_an_answer_not_started_here_is_refused_and_nothing_is_stored(fresh_install):
    browser = admin()
    answer = browser.get("/settings/github-app/created?code=abc&state=forged", follow=True)
    assert "not for a setup started here" in answer.content.decode()
    assert not SettingValue.objects.filter(key="github.app_id").exists()


def test_arch11_without_a_public_url_the_flow_does_not_start(fresh_install, monkeypatch):
    monkeypatch.delenv("ZOOMIES_SERVER_PUBLIC_URL")
    registry.reload()
    answer = admin().post("/settings/github-app", {"name": "x"}, follow=True)
    assert "set server.public_url first" in answer.content.decode()


def test_arch11_only_an_admin_starts_it(fresh_install):
    client = Client()
    client.force_login(make_user("otto", "operator"))
    assert client.post("/settings/github-app", {"name": "x"}).status_code == 403
    assert client.get("/settings/github-app/created?code=a&state=b").status_code == 403


def test_arch11_a_host_without_a_browser_of_its_own_creates_it_with_the_command(
    fresh_install, tmp_path
):
    """`github_app create` writes the manifest page; a browser anywhere submits it; the
    code GitHub's redirect carries goes to `github_app convert`."""
    fake, out = fresh_install, io.StringIO()
    page = tmp_path / "app.html"
    call_command("github_app", "create", "--out", str(page), stdout=out)
    text = page.read_text()
    action = html.unescape(re.search(r'action="([^"]+)"', text)[1])
    document = html.unescape(re.search(r'name="manifest" value="([^"]+)"', text)[1])
    at_github = httpx.post(action, data={"manifest": document}, follow_redirects=False, timeout=10)
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(at_github.headers["Location"]).query)
    call_command("github_app", "convert", code["code"][0], stdout=out)
    registry.reload()
    assert registry.get("github.app_id") == fake.app_id
    assert "installations/new" in out.getvalue()
    with pytest.raises(CommandError, match="codes work once"):
        call_command("github_app", "convert", code["code"][0], stdout=out)
