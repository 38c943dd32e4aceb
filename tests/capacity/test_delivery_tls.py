"""A try to an HTTPS receiver is verified as httpx would verify it (SSL_CERT_FILE, else
certifi's bundle), with the trust built once a process rather than on every try."""

from __future__ import annotations

import dataclasses
import http.server
import ssl
import threading
from datetime import timedelta

import pytest

from capacity import delivery
from capacity.actions import ClaimedTry
from capacity.config import load
from capacity.models import TryOutcome
from fleet.providers.proxmox.fake import make_certificates


class _Accepting(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def tls_receiver(tmp_path):
    """An HTTPS receiver whose certificate a private CA signed: (its URL, the CA's file)."""
    certificates = make_certificates(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates.cert_file, certificates.key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_port}/hook", certificates.ca_file
    server.shutdown()
    server.server_close()


@pytest.fixture
def trust_rebuilt():
    delivery.trust.cache_clear()
    yield
    delivery.trust.cache_clear()


def _send(url: str):
    config = dataclasses.replace(load(), signing_secret="s" * 64, timeout=timedelta(seconds=5))
    claimed = ClaimedTry(attempt_id=1, number=1, event_id="evt-1", destination_url=url,
                         body=b'{"type": "capacity.demand"}', stamp="1700000000")  # fmt: skip
    return delivery.send(claimed, config)


@pytest.mark.django_db
def test_a_receiver_behind_a_certificate_nobody_trusts_gets_no_body(
    tls_receiver, trust_rebuilt, registry_defaults, monkeypatch
):
    url, _ca = tls_receiver
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    outcome, status, error = _send(url)
    assert (outcome, status) == (TryOutcome.UNANSWERED, None)
    assert "CERTIFICATE_VERIFY_FAILED" in error


@pytest.mark.django_db
def test_ssl_cert_file_names_the_trusted_ca_and_the_trust_is_built_once(
    tls_receiver, trust_rebuilt, registry_defaults, monkeypatch
):
    url, ca = tls_receiver
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    assert _send(url)[:2] == (TryOutcome.ACCEPTED, 202)
    assert _send(url)[:2] == (TryOutcome.ACCEPTED, 202)
    assert delivery.trust.cache_info().misses == 1
