"""The agent program joins with a claim code instead of a join token (ESC-03, ESC-04):
`--claim-code` / ZOOMIES_CLAIM_CODE under the event's host name, sent in the join request's
`claim_code`, spent once, and a second join with the same code refused and audited."""

from __future__ import annotations

import argparse
import hashlib
import json

import httpx
import pytest
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

from accounts.models import AuditLog
from capacity.models import Spawn, SpawnState
from fleet.agent.agent import AgentError
from fleet.agent.cli import add_arguments, agent_from_options, build_agent
from fleet.agent.client import ControllerClient
from fleet.models import Host
from tests.capacity.test_claims import claiming, scale_up  # noqa: F401

pytestmark = pytest.mark.django_db
CONTROLLER = "http://testserver"


@pytest.fixture(autouse=True)
def keep_the_test_connection():
    """As Django's test client does: a request must not close the test's connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def wired(agent):
    """The agent's own client class, talking to this Django over WSGI in this thread."""
    agent.client = ControllerClient(
        CONTROLLER, transport=httpx.WSGITransport(app=get_wsgi_application())
    )
    return agent


def machine(tmp_path, which: str, *, name: str, code: str):
    return wired(
        build_agent(
            controller_url=CONTROLLER,
            state_dir=tmp_path / which,
            name=name,
            capacity=2,
            environ={"ZOOMIES_CLAIM_CODE": code},
        )
    )


def test_esc03_esc04_the_agent_joins_with_a_claim_code_once_and_a_second_join_is_refused(
    claiming,  # noqa: F811
    receiver,
    tmp_path,
):
    event = scale_up(claiming, receiver)
    code, name = event["claim_code"], event["host_name"]

    first = machine(tmp_path, "one", name=name, code=code)
    first.connect()
    host = Host.objects.get(name=name)
    assert first.host_id == host.pk and first.client.agent_token
    state = json.loads((tmp_path / "one" / "agent.json").read_text())
    assert code not in json.dumps(state)  # kept only as a hash, so a restart never re-offers it
    assert state["spent_join_token_sha256"] == [hashlib.sha256(code.encode()).hexdigest()]
    claiming.step(seconds=1)
    spawn = Spawn.objects.get()
    assert (spawn.state, spawn.host_id) == (SpawnState.ACTIVE, host.pk)

    second = machine(tmp_path, "two", name=name, code=code)  # another machine, same code
    with pytest.raises(AgentError, match="refused the claim code"):
        second.connect()
    refused = AuditLog.objects.get(action="capacity.claim.refused")
    assert refused.detail["reason"] == "spent" and code not in json.dumps(refused.detail)
    assert Host.objects.count() == 1


def test_esc03_the_command_line_takes_the_code_and_needs_the_host_name(tmp_path):

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = vars(
        parser.parse_args(
            ["--controller", CONTROLLER, "--state-dir", str(tmp_path), "--capacity", "1",
             "--claim-code", "c" * 64, "--name", "zoomies-spawn-abc"]
        )
    )  # fmt: skip
    agent = agent_from_options(options)
    assert (agent.claim_code, agent.join_token, agent.name) == ("c" * 64, None, "zoomies-spawn-abc")
    with pytest.raises(ValueError, match="pass --name"):
        build_agent(
            controller_url=CONTROLLER, state_dir=tmp_path, capacity=1,
            environ={"ZOOMIES_CLAIM_CODE": "c" * 64},
        )  # fmt: skip
