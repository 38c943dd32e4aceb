"""ESC-06: the agent token minted from a claim code expires, and the agent renews it.

The controller and the agent share one moved clock: `django.utils.timezone.now` (every view
and action of the agent protocol reads it) and the agent's own clock both read the capacity
loop's MovableClock, so nothing here sleeps.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import httpx
import pytest
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone

from accounts.models import AuditLog
from capacity.claims import code_hash
from capacity.models import Attempt, ClaimCode
from fleet import actions
from fleet.agent.agent import Agent, AgentError
from fleet.agent.backends.process import ProcessBackend
from fleet.agent.client import ControllerClient, Unauthorized
from fleet.models import Host
from fleet.selectors import hash_secret
from tests.capacity.test_claims import FACTS, claiming, scale_up  # noqa: F401
from zoomies_site.core.models import Event

pytestmark = pytest.mark.django_db
CONTROLLER = "http://testserver"
TTL = 600  # the peer's agentTokenTtlSeconds default


@pytest.fixture
def moved(claiming, monkeypatch):  # noqa: F811
    """The controller's clock is the test's clock."""
    monkeypatch.setattr(timezone, "now", lambda: claiming.clock.now)
    return claiming


def post(client, path, body=None, *, token=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.post(
        f"/api/v1/agent/{path}",
        data=json.dumps(body or {}),
        content_type="application/json",
        **headers,
    )


def claimed_join(moved, receiver, client):
    """Scale up and join with the event's claim code: (event, the join answer's body)."""
    event = scale_up(moved, receiver)
    answer = post(client, "join", {"name": event["host_name"], "claim_code": event["claim_code"],
                                   **FACTS})  # fmt: skip
    assert answer.status_code == 200, answer.content
    return event, answer.json()


def beats(client, token) -> int:
    return post(client, "heartbeat", {}, token=token).status_code


def test_esc06_a_claimed_credential_works_until_its_ttl_and_is_refused_after(
    moved, receiver, client
):
    _event, body = claimed_join(moved, receiver, client)
    joined = moved.clock.now
    assert body["agent_token_expires_in"] == TTL
    host = Host.objects.get(pk=body["host_id"])
    assert host.agent_token_expires_at == joined + timedelta(seconds=TTL)

    moved.clock.advance(seconds=TTL - 1)
    assert beats(client, body["agent_token"]) == 200
    moved.clock.advance(seconds=1)
    assert beats(client, body["agent_token"]) == 401
    # Every authenticated route refuses it, the long-poll and the renewal included.
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {body['agent_token']}"}
    assert client.get("/api/v1/agent/tasks?wait=0", **bearer).status_code == 401
    assert post(client, "token/renew", token=body["agent_token"]).status_code == 401
    assert not AuditLog.objects.filter(action="host.token.renew").exists()


def test_esc06_a_renewal_keeps_the_agent_working_past_the_ttl_and_is_audited(
    moved, receiver, client
):
    _event, body = claimed_join(moved, receiver, client)
    first = body["agent_token"]
    joined = moved.clock.now

    moved.clock.advance(seconds=TTL // 2)
    renewed = post(client, "token/renew", token=first)
    assert renewed.status_code == 200, renewed.content
    second = renewed.json()["agent_token"]
    assert second != first and renewed.json()["agent_token_expires_in"] == TTL
    audit = AuditLog.objects.get(action="host.token.renew")
    assert audit.actor == f"agent:{Host.objects.get().name}"
    assert audit.detail["token_prefix"] == second[:12]
    assert audit.detail["renewed_prefix"] == first[:12]
    assert audit.detail["renewed_expires_at"] == (joined + timedelta(seconds=TTL)).isoformat()

    # The renewed token keeps its own expiry (a request already sent with it still works),
    # and not a second longer; the new one runs from its renewal.
    moved.clock.advance(seconds=TTL // 2 - 1)
    assert (beats(client, first), beats(client, second)) == (200, 200)
    moved.clock.advance(seconds=1)
    assert (beats(client, first), beats(client, second)) == (401, 200)
    moved.clock.advance(seconds=TTL // 2 - 1)  # 1 s before the second's end
    assert beats(client, second) == 200
    moved.clock.advance(seconds=1)
    assert beats(client, second) == 401  # unless renewed again


def test_esc06_a_renewal_whose_answer_was_lost_is_asked_again_with_the_old_token(
    moved, receiver, client
):
    _event, body = claimed_join(moved, receiver, client)
    first = body["agent_token"]
    moved.clock.advance(seconds=TTL // 2)
    lost = post(client, "token/renew", token=first).json()["agent_token"]
    moved.clock.advance(seconds=5)
    again = post(client, "token/renew", token=first)
    assert again.status_code == 200
    kept = again.json()["agent_token"]
    # The answer never received is dropped; the token presented and the new one work.
    assert [beats(client, t) for t in (lost, first, kept)] == [401, 200, 200]
    assert AuditLog.objects.filter(action="host.token.renew").count() == 2


def test_esc06_an_ordinary_agent_token_does_not_expire_and_is_not_renewed(moved, receiver, client):
    _, secret = actions.create_join_token(now=moved.clock.now, actor="user:test")
    answer = post(client, "join", {"name": "zoomies-host-1", "join_token": secret, **FACTS})
    body = answer.json()
    assert "agent_token_expires_in" not in body
    assert Host.objects.get().agent_token_expires_at is None
    moved.clock.advance(days=400)
    assert beats(client, body["agent_token"]) == 200
    refused = post(client, "token/renew", token=body["agent_token"])
    assert refused.status_code == 409 and "does not expire" in refused.json()["error"]


def test_esc06_a_claimed_host_joining_again_with_a_join_token_drops_its_short_lived_tokens(
    moved, receiver, client
):
    event, body = claimed_join(moved, receiver, client)
    moved.clock.advance(seconds=TTL // 2)
    renewed = post(client, "token/renew", token=body["agent_token"]).json()["agent_token"]
    _, secret = actions.create_join_token(now=moved.clock.now, actor="user:test")
    rejoined = post(client, "join", {"name": event["host_name"], "join_token": secret, **FACTS})
    assert [beats(client, t) for t in (body["agent_token"], renewed)] == [401, 401]
    assert beats(client, rejoined.json()["agent_token"]) == 200
    assert Host.objects.get().agent_token_expires_at is None


def test_esc06_the_ttl_is_the_setting_read_live(moved, receiver, client, registry_defaults):
    registry_defaults.set("capacity_demand.agent_token_ttl", "120s")
    _event, body = claimed_join(moved, receiver, client)
    assert body["agent_token_expires_in"] == 120
    moved.clock.advance(seconds=60)
    registry_defaults.set("capacity_demand.agent_token_ttl", "300s")
    renewed = post(client, "token/renew", token=body["agent_token"])
    assert renewed.json()["agent_token_expires_in"] == 300
    moved.clock.advance(seconds=299)
    assert beats(client, renewed.json()["agent_token"]) == 200


def test_esc05_the_minted_and_renewed_credentials_appear_in_no_event_audit_row_or_log(
    moved, receiver, client, caplog
):
    caplog.set_level(logging.DEBUG)
    event, body = claimed_join(moved, receiver, client)
    tokens = [body["agent_token"]]
    for _ in range(3):
        moved.clock.advance(seconds=TTL // 2)
        answer = post(client, "token/renew", token=tokens[-1])
        tokens.append(answer.json()["agent_token"])
    host = Host.objects.get()
    assert host.agent_token_hash == hash_secret(tokens[-1])
    assert host.previous_agent_token_hash == hash_secret(tokens[-2])
    stored = json.dumps(
        [
            list(AuditLog.objects.values_list("detail", flat=True)),
            list(Event.objects.values_list("payload", flat=True)),
            list(Attempt.objects.values_list("body", flat=True)),
        ],
        default=str,
    )
    for token in tokens:
        assert token not in stored and token not in caplog.text
    # The claim code it was minted from: a hash in its row, nowhere else.
    code = event["claim_code"]
    assert ClaimCode.objects.get().code_hash == code_hash(code)
    assert code not in stored and code not in caplog.text


# -- the agent's side ------------------------------------------------------------------------


@pytest.fixture
def keep_the_test_connection():
    """As Django's test client does: a request must not close the test's connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def claimed_agent(moved, tmp_path, event, which="machine") -> Agent:
    """The agent program of the provisioned machine, on the test's clock, talking to this
    Django over WSGI in this thread."""
    work = tmp_path / which / "work"
    return Agent(
        CONTROLLER,
        tmp_path / which,
        work,
        [ProcessBackend(work)],
        name=event["host_name"],
        capacity=2,
        claim_code=event["claim_code"],
        clock=lambda: moved.clock.now.timestamp(),
        client=ControllerClient(
            CONTROLLER, transport=httpx.WSGITransport(app=get_wsgi_application())
        ),
    )


@pytest.mark.usefixtures("keep_the_test_connection")
def test_esc06_the_agent_renews_at_half_life_and_works_past_the_ttl(moved, receiver, tmp_path):
    event = scale_up(moved, receiver)
    agent = claimed_agent(moved, tmp_path, event)
    agent.connect()
    first = agent.client.agent_token
    state = json.loads((tmp_path / "machine" / "agent.json").read_text())
    assert state["agent_token_expires_at"] == moved.clock.now.timestamp() + TTL

    moved.clock.advance(seconds=TTL // 2 - 1)
    assert agent.renew_token_if_due() == 1  # not yet: a second to go
    assert agent.client.agent_token == first
    moved.clock.advance(seconds=1)
    assert agent.renew_token_if_due() == TTL // 2
    second = agent.client.agent_token
    assert second != first
    assert json.loads((tmp_path / "machine" / "agent.json").read_text())["agent_token"] == second

    moved.clock.advance(seconds=TTL // 2 + 1)  # past the first token's end
    agent.heartbeat_once()
    # A restart reads the renewed token from agent.json and carries on with it.
    restarted = claimed_agent(moved, tmp_path, event)
    restarted.connect()
    assert restarted.client.agent_token == second
    restarted.heartbeat_once()

    moved.clock.advance(seconds=TTL)  # nobody renewed: the second has ended too
    with pytest.raises(Unauthorized):
        agent.heartbeat_once()
    with pytest.raises(AgentError, match="has expired and cannot be renewed"):
        claimed_agent(moved, tmp_path, event).connect()


@pytest.mark.usefixtures("keep_the_test_connection")
def test_esc06_the_heartbeat_loop_renews_even_when_its_interval_outlasts_the_token(
    moved, receiver, tmp_path, registry_defaults
):
    registry_defaults.set("agent.heartbeat_interval", "1h")
    registry_defaults.set("agent.heartbeat_timeout", "3h")
    event = scale_up(moved, receiver)
    agent = claimed_agent(moved, tmp_path, event)
    agent.connect()
    waits = []

    def wait(seconds: float) -> bool:
        """The loop's pause: the clock moves on by it; three hours of loop, then stop."""
        waits.append(seconds)
        moved.clock.advance(seconds=seconds)
        return sum(waits) >= 3 * 3600

    agent.heartbeat_loop(wait)
    assert agent.fatal_error is None
    assert max(waits) <= TTL // 2  # never a wait past the next renewal
    # One renewal at the top of each pass after the first: 36 passes of 300 s in 3 hours.
    assert len(waits) == 3 * 3600 // (TTL // 2)
    assert AuditLog.objects.filter(action="host.token.renew").count() == len(waits) - 1
    assert Host.objects.get().agent_token_hash == hash_secret(agent.client.agent_token)
