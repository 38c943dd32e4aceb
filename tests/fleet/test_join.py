"""Joining: join tokens are short-lived and single-use (AUTH-08); a rejoin keeps the id,
gets a new token and drops the old registration's runners (HOST-06); ARCH-08's one command.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import httpx
import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.utils import timezone

from accounts.models import AuditLog
from fleet import actions
from fleet.models import AgentTask, Host, JoinToken
from fleet.selectors import hash_secret
from runners.models import Job, Runner
from tests.fleet.conftest import FACTS, T0, join, make_runner

pytestmark = pytest.mark.usefixtures("registry_defaults")


def new_join_token(**kw) -> str:
    return actions.create_join_token(now=timezone.now(), actor="user:test", **kw)[1]


@pytest.mark.django_db
def test_auth08_a_join_token_is_stored_only_as_its_sha256():
    token, secret = actions.create_join_token(now=T0, actor="user:ada")
    assert secret.startswith("zjt_") and len(secret) > 40
    assert token.token_hash == hash_secret(secret)
    assert secret not in {token.token_hash, token.prefix}
    assert token.expires_at == T0 + timedelta(hours=1)
    assert AuditLog.objects.filter(action="join_token.create", actor="user:ada").exists()


@pytest.mark.django_db(transaction=True)
def test_auth08_joining_with_a_valid_token_answers_host_id_and_agent_token(agent_api):
    secret = new_join_token()
    answer = agent_api.post("join", {"join_token": secret, "name": "zoomies-host-1", **FACTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    host = Host.objects.get(name="zoomies-host-1")
    assert body["host_id"] == host.pk
    assert body["agent_token"].startswith("zat_")
    assert body["heartbeat_interval"] == 30
    # The agent token is stored hashed with a visible prefix; it works at once.
    assert host.agent_token_hash == hash_secret(body["agent_token"])
    assert body["agent_token"].startswith(host.agent_token_prefix)
    assert (host.capacity, host.platform, host.backends) == (4, "linux/x64", ["process"])
    assert (host.disk_total_mb, host.disk_free_mb, host.labels) == (100_000, 50_000, {"zone": "a"})
    assert host.health == "healthy" and host.joined_at is not None
    assert JoinToken.objects.get(token_hash=hash_secret(secret)).host == host
    beat = agent_api.post("heartbeat", {}, token=body["agent_token"])
    assert beat.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_auth08_a_spent_expired_or_unknown_join_token_is_401(agent_api):
    spent = new_join_token()
    assert agent_api.post("join", {"join_token": spent, "name": "h1"}).status_code == 200
    expired = actions.create_join_token(
        now=timezone.now() - timedelta(hours=2), actor="user:test", ttl=timedelta(hours=1)
    )[1]
    for token in (spent, expired, "zjt_never-issued", None):
        answer = agent_api.post("join", {"join_token": token, "name": "h2"})
        assert answer.status_code == 401, token
        assert "error" in answer.json()
    assert not Host.objects.filter(name="h2").exists()


@pytest.mark.django_db(transaction=True)
def test_auth08_a_join_token_is_single_use_under_two_concurrent_joins():
    secret = new_join_token()
    barrier = threading.Barrier(2)
    results: list[str] = []

    def attempt(name: str) -> None:
        barrier.wait()
        try:
            for _ in range(200):
                try:
                    actions.join_host(join_token=secret, name=name, facts=FACTS, now=timezone.now())
                    results.append("joined")
                    return
                except actions.InvalidJoinToken:
                    results.append("refused")
                    return
                except OperationalError:  # SQLite's test database: a lock, so try again
                    time.sleep(0.01)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(f"racer-{i}",)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == ["joined", "refused"]
    assert Host.objects.filter(name__startswith="racer-").count() == 1


@pytest.mark.django_db(transaction=True)
def test_host06_a_rejoin_keeps_the_id_gives_a_new_token_and_drops_live_runners(agent_api):
    first = agent_api.post("join", {"join_token": new_join_token(), "name": "h1", **FACTS})
    old = first.json()
    host = Host.objects.get(pk=old["host_id"])
    provisioning = make_runner(host, "provisioning")
    idle = make_runner(host, "idle")
    busy = make_runner(host, "busy")
    ended = make_runner(host, "removed")
    job = Job.objects.create(
        github_id=1,
        repository="acme/app",
        status="in_progress",
        runner=busy,
        runner_name=busy.name,
        created_at=T0,
        updated_at=T0,
    )
    pending_create = AgentTask.objects.create(
        host=host, runner=provisioning, kind="create_runner", lease_seconds=1200, created_at=T0
    )

    again = agent_api.post("join", {"join_token": new_join_token(), "name": "h1", **FACTS})
    assert again.status_code == 200
    new = again.json()
    assert new["host_id"] == old["host_id"]
    assert new["agent_token"] != old["agent_token"]
    assert agent_api.post("heartbeat", {}, token=old["agent_token"]).status_code == 401
    assert agent_api.post("heartbeat", {}, token=new["agent_token"]).status_code == 200

    for runner in (provisioning, idle, busy):
        runner.refresh_from_db()
        assert runner.state == "failed"
        assert runner.message == "the host joined again; its runners were dropped"
    ended.refresh_from_db()
    assert ended.state == "removed" and ended.message == ""
    job.refresh_from_db()
    assert job.fleet_failure
    pending_create.refresh_from_db()
    assert pending_create.state == "cancelled"
    assert AuditLog.objects.filter(action="host.rejoin", actor="agent:h1").exists()


@pytest.mark.django_db
def test_host06_a_rejoined_lost_host_is_healthy_again():
    host, _ = join("h1")
    Host.objects.filter(pk=host.pk).update(health="lost")
    again, _ = join("h1", now=T0 + timedelta(minutes=10))
    assert again.pk == host.pk
    assert again.health == "healthy"
    assert Runner.objects.filter(host=host).count() == 0


@pytest.mark.django_db(transaction=True)
def test_join_answers_400_for_bad_json_or_a_bad_name_and_405_for_get(agent_api):

    bad = httpx.post(agent_api.base + "join", content=b"{nope", timeout=10)
    assert bad.status_code == 400 and "error" in bad.json()
    named = agent_api.post("join", {"join_token": new_join_token(), "name": "no spaces"})
    assert named.status_code == 400
    assert httpx.get(agent_api.base + "join", timeout=10).status_code == 405
    facts = agent_api.post("join", {"join_token": new_join_token(), "name": "h", "capacity": "x"})
    assert facts.status_code == 400


@pytest.mark.django_db
def test_arch08_create_join_token_prints_a_token_that_joins():
    out, err = StringIO(), StringIO()
    call_command("create_join_token", "--ttl", "30m", stdout=out, stderr=err)
    secret = out.getvalue().strip()
    assert secret.startswith("zjt_")
    token = JoinToken.objects.get(token_hash=hash_secret(secret))
    assert token.expires_at - token.created_at == timedelta(minutes=30)
    host, agent_token = actions.join_host(
        join_token=secret, name="h1", facts={}, now=timezone.now()
    )
    assert agent_token.startswith("zat_") and host.pk
