"""AUTH-02: single sign-on through a real OpenID provider (oidc-provider-mock, from PyPI) run
on loopback in a second process. The authorization code flow is driven over real HTTP: a
browser (httpx, following redirects, keeping cookies) against Django's live server, which
exchanges the code at the provider's token endpoint and reads its userinfo itself.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from accounts import oidc
from accounts.models import AuditLog, User
from zoomies_site.core import registry

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "oidc_provider_mock", "--port", str(port),
         "--require-registration", "true"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/.well-known/openid-configuration").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the provider did not start: {process.stderr.read()!r}")
        time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def sso(provider, live_server, monkeypatch):
    """Zoomies registered at the provider as a confidential client, and configured for it."""
    answer = httpx.post(f"{provider}/oauth2/clients", json={
        "redirect_uris": [f"{live_server.url}/oidc/callback/"],
        "token_endpoint_auth_method": "client_secret_post",
    })  # fmt: skip
    assert answer.status_code == 201, answer.text
    client = answer.json()
    for key, value in {
        "auth.oidc_issuer": provider,
        "auth.oidc_client_id": client["client_id"],
        "auth.oidc_client_secret": client["client_secret"],
        "auth.oidc_admin_groups": "zoomies-admins",
        "auth.oidc_viewer_groups": "zoomies-viewers",
    }.items():
        monkeypatch.setenv(registry.SETTINGS[key].env, value)
    registry.reload()
    oidc.clear_discovery_cache()
    yield provider
    oidc.clear_discovery_cache()


def set_claims(provider: str, sub: str, **claims) -> None:
    answer = httpx.put(f"{provider}/users/{sub}", content=json.dumps(claims),
                       headers={"Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 204, answer.text


def sign_in(live_server, sub: str) -> httpx.Client:
    """What a browser does: start at Zoomies, authorize as `sub` at the provider, come back."""
    browser = httpx.Client(follow_redirects=True, timeout=30)
    form = browser.get(f"{live_server.url}/oidc/authenticate/", params={"next": "/api/v1/tokens"})
    assert form.status_code == 200 and form.url.path == "/oauth2/authorize", form.url
    back = browser.post(form.url, data={"sub": sub})
    browser.landed = back  # type: ignore[attr-defined]
    return browser


def test_auth02_fake06_a_mapped_user_signs_in_through_the_provider(sso, live_server):
    set_claims(sso, "alice-sub", preferred_username="alice", email="alice@example.com",
               groups=["staff", "zoomies-admins"])  # fmt: skip
    browser = sign_in(live_server, "alice-sub")
    landed = browser.landed
    assert landed.status_code == 200, landed.text
    assert landed.url.path == "/api/v1/tokens"  # the `next` it started with, signed in
    user = User.objects.get(oidc_subject=f"{sso} alice-sub")
    assert (user.username, user.email, user.role) == ("alice", "alice@example.com", "admin")
    assert not user.has_usable_password()
    assert AuditLog.objects.filter(action="user.create", actor="system:oidc").count() == 1
    # The session is a real one: the admin and the API take it.
    assert browser.get(f"{live_server.url}/admin/").status_code == 200
    assert browser.get(f"{live_server.url}/api/v1/audit").status_code == 200


def test_auth02_a_user_with_no_mapped_group_is_refused(sso, live_server):
    set_claims(sso, "mallory-sub", preferred_username="mallory", groups=["contractors"])
    browser = sign_in(live_server, "mallory-sub")
    landed = browser.landed
    assert landed.url.path == "/admin/login/" and "sso=refused" in str(landed.url)
    assert "no group that maps to a Zoomies role" in landed.text
    assert browser.get(f"{live_server.url}/api/v1/pools").status_code in (401, 403)
    assert not User.objects.filter(username="mallory").exists()


def test_auth02_the_role_follows_the_groups_at_each_sign_in(sso, live_server):
    set_claims(sso, "bob-sub", preferred_username="bob", groups=["zoomies-admins"])
    sign_in(live_server, "bob-sub")
    assert User.objects.get(username="bob").role == "admin"
    set_claims(sso, "bob-sub", preferred_username="bob", groups=["zoomies-viewers"])
    browser = sign_in(live_server, "bob-sub")
    assert User.objects.get(username="bob").role == "viewer"
    assert AuditLog.objects.filter(action="user.update", actor="system:oidc").count() == 1
    assert browser.get(f"{live_server.url}/api/v1/pools").status_code == 200
    # Taken out of every mapped group: the existing account is not let in on its old rights.
    set_claims(sso, "bob-sub", preferred_username="bob", groups=[])
    browser = sign_in(live_server, "bob-sub")
    assert "sso=refused" in str(browser.landed.url)
    assert browser.get(f"{live_server.url}/api/v1/pools").status_code in (401, 403)


def test_auth02_an_sso_user_never_takes_over_a_local_account(sso, live_server):
    local = User.objects.create_user(username="carol", password="a local password", role="viewer")
    set_claims(sso, "carol-sub", preferred_username="carol", groups=["zoomies-admins"])
    sign_in(live_server, "carol-sub")
    local.refresh_from_db()
    assert local.role == "viewer" and local.oidc_subject is None
    assert User.objects.get(oidc_subject=f"{sso} carol-sub").username == "carol-2"


def test_sso_is_off_without_an_issuer(live_server):
    assert httpx.get(f"{live_server.url}/oidc/authenticate/").status_code == 404
    page = httpx.get(f"{live_server.url}/admin/login/")
    assert page.status_code == 200 and "single sign-on" not in page.text


def test_auth02_an_id_token_for_another_client_or_issuer_is_refused(sso, monkeypatch):

    backend = oidc.ZoomiesOIDCBackend()
    good = {"iss": sso, "aud": backend.OIDC_RP_CLIENT_ID, "sub": "x"}
    for payload, ok in (
        (good, True),
        ({**good, "aud": [backend.OIDC_RP_CLIENT_ID, "other"]}, True),
        ({**good, "aud": "someone-else"}, False),
        ({**good, "iss": "http://evil.example"}, False),
    ):
        signed = lambda s, t, p=payload, **k: p  # noqa: E731 - the provider's checked payload
        monkeypatch.setattr(OIDCAuthenticationBackend, "verify_token", signed)
        if ok:
            assert backend.verify_token("t") == payload
        else:
            with pytest.raises(SuspiciousOperation):
                backend.verify_token("t")
