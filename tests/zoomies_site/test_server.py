"""The web server's configuration, read from the registry (zoomies_site/server.py); what a
client meets over a socket is in tests/e2e/test_web_server.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from zoomies_site import server
from zoomies_site.core import registry


def test_plain_http_is_the_bind_and_the_internal_loopback_listener():
    """Issue 21 item 12: the controller's own clients have a listener of their own on plain
    HTTP too, which the per-client cap does not count."""
    assert server.endpoints("127.0.0.1", 8080, cert="", key="", internal_port=9) == [
        "tcp:port=8080:interface=127.0.0.1",
        "tcp:port=9:interface=127.0.0.1",
    ]
    assert server.endpoints("127.0.0.1", 8080, cert="", key="", internal_port=None) == [
        "tcp:port=8080:interface=127.0.0.1"
    ]


def test_tls_serves_the_bind_from_the_cert_and_key_and_adds_the_loopback_listener():
    found = server.endpoints("::", 8443, cert="/etc/z:1/cert.pem", key="/k.pem", internal_port=9)
    assert found == [
        r"ssl:port=8443:interface=\:\::privateKey=/k.pem:certKey=/etc/z\:1/cert.pem",
        "tcp:port=9:interface=127.0.0.1",
    ]


def test_half_a_tls_configuration_serves_plain_http():
    """The registry refuses it with an error finding (config.tls_incomplete) anyway."""
    assert server.endpoints("127.0.0.1", 1, cert="/c.pem", key="", internal_port=None) == [
        "tcp:port=1:interface=127.0.0.1"
    ]


@pytest.mark.django_db
def test_the_limits_come_from_the_registry(monkeypatch):
    monkeypatch.setenv("ZOOMIES_SERVER_REQUEST_TIMEOUT", "20s")
    monkeypatch.setenv("ZOOMIES_SERVER_MAX_CONNECTIONS_PER_CLIENT", "9")
    monkeypatch.setenv("ZOOMIES_SERVER_MAX_REQUEST_BODY", str(1024 * 1024))
    registry.reload()
    limits = server.limits_from_registry()
    assert limits == server.Limits(request_timeout=20.0, max_body=1024 * 1024, max_per_client=9)
    # A second per MiB of declared body on top of the timeout.
    assert limits.budget(None) == 20.0
    assert limits.budget(3 * 1024 * 1024) == 23.0
    assert timedelta(seconds=limits.budget(0)) == registry.get("server.request_timeout")
