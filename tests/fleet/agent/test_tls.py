"""Agent-side TLS (issue 7 item 3): the agent verifies the controller's certificate against
a CA bundle it is given (`--ca-file` / ZOOMIES_AGENT_CA_FILE), and refuses one it cannot
verify, with a certificate authority this test makes."""

from __future__ import annotations

import ssl

import pytest

from fleet.agent.cli import CA_FILE_ENV, build_agent, main
from fleet.agent.client import ControllerClient, ControllerUnavailable
from tests.fleet.agent.certs import issue_server_cert, make_ca
from tests.fleet.agent.fakes import JOIN_TOKEN, FakeController, serving


@pytest.fixture
def pki(tmp_path):
    ca = make_ca()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.pem())
    cert, key = issue_server_cert(ca, tmp_path / "server", ["localhost", "127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    other = make_ca("Some other CA")
    other_file = tmp_path / "other-ca.pem"
    other_file.write_bytes(other.pem())
    return {"ca_file": str(ca_file), "other_ca_file": str(other_file), "context": context}


@pytest.fixture
def https_controller(pki):
    with serving(FakeController(), tls=pki["context"], host="localhost") as fake:
        yield fake


def test_an_agent_given_the_ca_joins_a_controller_over_https(https_controller, pki):
    assert https_controller.url.startswith("https://localhost:")
    client = ControllerClient(https_controller.url, ca_file=pki["ca_file"])
    answer = client.join(JOIN_TOKEN, {"name": "tls-host"})
    client.agent_token = answer.agent_token
    assert client.heartbeat({}).tunables.heartbeat_interval == 30
    client.close()


@pytest.mark.parametrize("ca", ["other_ca_file", None])
def test_an_agent_refuses_a_controller_whose_certificate_it_cannot_verify(
    https_controller, pki, ca
):
    """Another CA's bundle, or the public CAs: the self-made CA is trusted by neither."""
    client = ControllerClient(https_controller.url, ca_file=pki[ca] if ca else None, timeout=5)
    with pytest.raises(ControllerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        client.join(JOIN_TOKEN, {"name": "tls-host"})
    client.close()
    assert https_controller.calls == [], "no request reached the controller"


def test_the_ca_file_comes_from_the_option_or_the_environment(https_controller, pki, tmp_path):
    environ = {CA_FILE_ENV: pki["ca_file"], "ZOOMIES_JOIN_TOKEN": JOIN_TOKEN}
    agent = build_agent(
        controller_url=https_controller.url,
        state_dir=tmp_path / "state",
        name="tls-host",
        capacity=1,
        environ=environ,
    )
    agent.connect()
    assert agent.host_id == 7
    agent.client.close()


def test_a_ca_file_that_is_not_there_is_the_operators_error(capsys, tmp_path):
    missing = tmp_path / "nope.pem"
    code = main(["--controller", "https://localhost:1", "--ca-file", str(missing),
                 "--state-dir", str(tmp_path / "s")])  # fmt: skip
    assert code == 1
    assert f"the CA bundle {missing} is not a readable file" in capsys.readouterr().err
