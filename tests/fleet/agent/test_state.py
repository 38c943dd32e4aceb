"""agent.json and joining: AGENT-21, AGENT-22, and the 401 that stops the agent."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest

from fleet.agent.agent import AgentError
from fleet.agent.state import AgentState, JoinTokenSpent, StateStore
from tests.fleet.agent.fakes import JOIN_TOKEN


def test_agent21_state_file_holds_no_join_token(make_agent, controller, dirs):
    agent = make_agent()
    agent.connect()

    path = dirs[0] / "agent.json"
    text = path.read_text()
    data = json.loads(text)
    assert JOIN_TOKEN not in text
    assert set(data) == {"host_id", "agent_token", "controller_url", "spent_join_token_sha256"}
    assert data["host_id"] == 7
    assert data["agent_token"].startswith("zat_")
    assert data["controller_url"] == controller.url
    assert data["spent_join_token_sha256"] == [hashlib.sha256(JOIN_TOKEN.encode()).hexdigest()]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [p for p in dirs[0].iterdir() if p.name != "agent.json"], "no temp file left"


def test_agent21_join_sends_the_host_and_its_disk(make_agent, controller):
    """HOST-07/HOST-08: the join carries the host's size and its work dir's filesystem."""
    make_agent().connect()

    (join,) = controller.calls_to("/join")
    assert "authorization" not in join.headers
    body = join.body
    assert body["join_token"] == JOIN_TOKEN
    assert body["name"] == "test-host"
    assert body["backends"] == ["process"]
    assert body["platform"] in ("linux/x64", "linux/arm64") or body["platform"].startswith("linux/")
    assert body["cpus"] > 0 and body["memory_mb"] > 0
    assert body["disk_total_mb"] >= body["disk_free_mb"] >= 0 and body["disk_total_mb"] > 0


def test_agent21_a_restart_reuses_the_credentials_and_joins_no_more(make_agent, controller):
    first = make_agent()
    first.connect()
    second = make_agent()
    second.connect()

    assert len(controller.calls_to("/join")) == 1
    assert second.host_id == 7
    assert second.heartbeat_once() == controller.heartbeat_interval


def test_agent22_a_restart_does_not_offer_a_spent_join_token(make_agent, controller, dirs):
    """The host is deleted (401), the agent forgets its credentials, and a restart with the
    same token still in its environment refuses to offer it."""
    agent = make_agent()
    agent.connect()
    controller.revoke_agent_tokens()
    controller.join_tokens.add(JOIN_TOKEN)  # even if the controller would take it again

    agent.heartbeat_loop(wait=lambda seconds: True)

    assert agent.fatal_error and "no longer accepts" in agent.fatal_error
    assert agent.stopping
    state = StateStore(dirs[0]).load()
    assert state.agent_token is None and state.host_id is None
    assert state.is_spent(JOIN_TOKEN)

    restarted = make_agent()
    with pytest.raises(JoinTokenSpent, match="already spent"):
        restarted.connect()
    assert len(controller.calls_to("/join")) == 1


def test_agent22_a_new_join_token_joins_again(make_agent, controller, dirs):
    StateStore(dirs[0]).save(AgentState(spent_join_token_hashes=["0" * 64]))
    controller.join_tokens.add("zjt_fresh")

    agent = make_agent(join_token="zjt_fresh")
    agent.connect()

    state = StateStore(dirs[0]).load()
    assert state.host_id == 7
    assert len(state.spent_join_token_hashes) == 2


def test_a_refused_join_token_is_a_clear_error(make_agent, controller):
    with pytest.raises(AgentError, match="refused the join token"):
        make_agent(join_token="zjt_unknown").connect()


def test_no_credentials_and_no_join_token_is_a_clear_error(make_agent):
    with pytest.raises(AgentError, match="ZOOMIES_JOIN_TOKEN"):
        make_agent(join_token=None).connect()


def test_credentials_for_another_controller_are_not_used(make_agent, dirs):
    StateStore(dirs[0]).save(
        AgentState(host_id=3, agent_token="zat_x", controller_url="http://elsewhere:8000")
    )
    with pytest.raises(AgentError, match="http://elsewhere:8000"):
        make_agent(join_token=None).connect()


def test_a_401_on_the_task_poll_stops_the_agent_with_a_message(make_agent, controller):
    agent = make_agent()
    agent.connect()
    controller.revoke_agent_tokens()

    agent.poll_loop(wait=0, pause=lambda seconds: True)

    assert agent.stopping
    assert "ZOOMIES_JOIN_TOKEN" in (agent.fatal_error or "")
