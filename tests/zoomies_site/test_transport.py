"""SEC-04, SEC-01: secure cookies behind TLS. The session and CSRF cookies are Secure exactly
when browsers reach the controller over HTTPS (its own TLS, or a proxy in front that says
so with X-Forwarded-Proto); the public-bind finding is raised exactly when credentials do
cross the network in plain text, and says what is true of the proxy case."""

from __future__ import annotations

import itertools

import pytest
from django.test import Client, override_settings

from accounts.actions import create_user
from tests.zoomies_site.layers import only
from zoomies_site.core import registry
from zoomies_site.core.transport import PROXY_HEADER, cookie_settings

CERT = {"server.tls_cert": "/etc/zoomies/cert.pem", "server.tls_key": "/etc/zoomies/key.pem"}
PROXIED_HOST = "zoomies.example.com"
PROXIED = f"https://{PROXIED_HOST}"
BINDS = ["127.0.0.1:8080", "[::1]:8080", "0.0.0.0:8443", "10.0.0.5:8080"]


def values(bind: str, tls: bool, proxy: bool) -> registry.Values:
    db = {"server.bind": bind, "server.tls_proxy": proxy, **(CERT if tls else {})}
    return only(db_values=db)


@pytest.mark.parametrize(
    ("bind", "tls", "proxy"), list(itertools.product(BINDS, (False, True), (False, True)))
)
def test_sec04_cookies_are_secure_and_the_finding_raised_exactly_when_each_is_true(
    bind, tls, proxy
):
    """SEC-04: both directions, over every bind, TLS and proxy combination."""
    configured = values(bind, tls, proxy)
    wanted = cookie_settings(configured)
    https = tls or proxy
    assert wanted["SESSION_COOKIE_SECURE"] is https
    assert wanted["CSRF_COOKIE_SECURE"] is https
    # X-Forwarded-Proto is believed only when the operator says a proxy sets it.
    assert wanted["SECURE_PROXY_SSL_HEADER"] == (PROXY_HEADER if proxy else None)

    found = {f.key: f for f in registry.validate(configured)}
    public = not bind.startswith(("127.", "[::1]"))
    # The finding says credentials cross the network in plain text: true when the controller
    # listens beyond loopback without TLS of its own, a proxy in front or not.
    assert ("config.bind_without_tls" in found) is (public and not tls)
    if "config.bind_without_tls" in found:
        finding = found["config.bind_without_tls"]
        assert ("bypasses" in finding.why) is proxy
        # Its claim about cookies is true: nothing but a proxy marks them Secure here.
        assert wanted["SESSION_COOKIE_SECURE"] is proxy


def test_sec01_out_of_the_box_the_cookies_are_plain_so_loopback_sign_in_works():
    assert cookie_settings(only()) == {
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_PROXY_SSL_HEADER": None,
    }


def _sign_in(client: Client, **https) -> tuple[int, dict]:
    """The admin's login form, as a browser submits it; the answer and the cookies set."""
    page = client.get("/admin/login/", **https)
    token = page.cookies["csrftoken"].value
    answer = client.post(
        "/admin/login/?next=/",
        {"username": "ada", "password": "a long enough password", "csrfmiddlewaretoken": token},
        **https,
    )
    return answer.status_code, {**page.cookies, **answer.cookies}


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["plain", "tls", "proxy"])
def test_sec04_the_cookies_the_controller_sets_follow_its_transport(mode):
    """SEC-04: the settings the web server applies (zoomies_site.server) make the cookies
    a browser gets; each way in, a browser signs in and holds a session."""
    create_user(username="ada", role="admin", password="a long enough password", actor="t")
    configured = values("127.0.0.1:8080", mode == "tls", mode == "proxy")
    origin = {"plain": "http://testserver", "tls": "https://testserver"}.get(mode, PROXIED)
    https = {
        "plain": {},
        "tls": {"secure": True},
        # The proxy speaks plain HTTP to the controller, passing the browser's Host on.
        "proxy": {"HTTP_X_FORWARDED_PROTO": "https", "HTTP_HOST": PROXIED_HOST},
    }[mode]
    with override_settings(**cookie_settings(configured)):
        client = Client(enforce_csrf_checks=True, HTTP_ORIGIN=origin)
        status, cookies = _sign_in(client, **https)
        assert status == 302, "signed in"
        assert bool(cookies["sessionid"]["secure"]) is (mode != "plain")
        assert bool(cookies["csrftoken"]["secure"]) is (mode != "plain")
        assert client.get("/api/v1/overview", **https).status_code == 200


@pytest.mark.django_db
def test_sec04_without_server_tls_proxy_a_forwarded_proto_is_not_believed():
    """A client that claims HTTPS in a header is not taken at its word: its https Origin
    then does not match, and the sign-in is refused as a cross-site request."""
    create_user(username="ada", role="admin", password="a long enough password", actor="t")
    with override_settings(**cookie_settings(values("127.0.0.1:8080", False, False))):
        client = Client(enforce_csrf_checks=True, HTTP_ORIGIN=PROXIED)
        status, _ = _sign_in(client, HTTP_X_FORWARDED_PROTO="https", HTTP_HOST=PROXIED_HOST)
        assert status == 403
