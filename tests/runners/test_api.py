"""The read API and pool creation, over a real socket, with scoped API tokens."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from accounts.models import ApiToken, User
from accounts.tokens import create_api_token, hash_secret
from fleet.models import Host
from runners.models import Installation, Job, Pool, Runner

pytestmark = pytest.mark.django_db(transaction=True)
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ROUTES = ["pools", "runners", "jobs", "hosts", "problems"]


@pytest.fixture
def tokens():
    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _r, reader = create_api_token(user=user, name="r", scopes=["fleet:read"], actor="test")
    _w, writer = create_api_token(user=user, name="w", scopes=["fleet:write"], actor="test")
    _n, nothing = create_api_token(user=user, name="n", scopes=[], actor="test")
    return {"read": reader, "write": writer, "none": nothing}


def call(live_server, method, route, token=None, **kwargs):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(
        method, f"{live_server.url}/api/v1/{route}", headers=headers, timeout=10, **kwargs
    )


def test_auth05_only_the_hash_of_a_token_is_stored(tokens):
    for secret in tokens.values():
        assert not ApiToken.objects.filter(secret_hash=secret).exists()
        assert ApiToken.objects.filter(secret_hash=hash_secret(secret)).exists()


@pytest.mark.parametrize("route", ROUTES)
def test_auth04_every_read_route_needs_a_token_with_the_read_scope(live_server, tokens, route):
    assert call(live_server, "GET", route).status_code in (401, 403)
    assert call(live_server, "GET", route, "zpt_not-a-token").status_code == 401
    assert call(live_server, "GET", route, tokens["none"]).status_code == 403
    assert call(live_server, "GET", route, tokens["read"]).status_code == 200
    assert call(live_server, "GET", route, tokens["write"]).status_code == 200


def test_auth04_creating_a_pool_needs_the_write_scope(live_server, tokens):
    body = {"name": "zoomies-linux", "labels": ["linux"], "backend": "process"}
    assert call(live_server, "POST", "pools", tokens["read"], json=body).status_code == 403
    created = call(live_server, "POST", "pools", tokens["write"], json=body)
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "zoomies-linux"
    assert Pool.objects.get(name="zoomies-linux").ephemeral is True  # ARCH-09


def test_sched14_a_pool_name_off_the_grammar_is_a_clear_400(live_server, tokens):
    response = call(
        live_server,
        "POST",
        "pools",
        tokens["write"],
        json={"name": "Build Pool", "labels": ["build"]},
    )
    assert response.status_code == 400
    assert "name" in response.json()
    assert not Pool.objects.exists()


def test_the_get_shapes_list_what_the_rows_say(live_server, tokens):
    installation = Installation.objects.create(github_id=1, account="acme")
    pool = Pool.objects.create(name="zoomies-a", installation=installation, backend="process")
    host = Host.objects.create(name="zoomies-h", capacity=3, backends=["process"])
    Runner.objects.create(
        name="zoomies-a-1-x", pool=pool, host=host, state="idle", created_at=T0,
        state_changed_at=T0,
    )  # fmt: skip
    Job.objects.create(
        github_id=5, repository="acme/app", labels=["self-hosted"], status="queued",
        created_at=T0, updated_at=T0,
    )  # fmt: skip
    runners = call(live_server, "GET", "runners", tokens["read"]).json()["results"]
    assert runners[0]["name"] == "zoomies-a-1-x"
    assert runners[0]["pool"] == "zoomies-a" and runners[0]["host"] == "zoomies-h"
    hosts = call(live_server, "GET", "hosts", tokens["read"]).json()["results"]
    assert hosts[0]["runners"] == 1 and hosts[0]["capacity"] == 3
    jobs = call(live_server, "GET", "jobs?status=queued", tokens["read"]).json()["results"]
    assert [j["github_id"] for j in jobs] == [5]


def test_poll04_the_problems_list_says_when_the_fleet_runs_on_polling_alone(live_server, tokens):
    """POLL-04, EVT-07: running on polling alone is a problem under github.polling_only."""
    now = datetime.now(UTC)
    Installation.objects.create(
        github_id=1, account="acme", last_polled_at=now - timedelta(seconds=5)
    )
    problems = call(live_server, "GET", "problems", tokens["read"]).json()["results"]
    polling = [p for p in problems if p["key"] == "github.polling_only"]
    assert polling and "polling alone" in polling[0]["title"]


def test_sched18_runners_not_online_at_half_the_provision_timeout_are_a_problem(
    live_server, tokens
):
    """SCHED-18, EVT-07: runners not online in time are a problem under
    runners.not_progressing, naming them."""
    now = datetime.now(UTC)
    pool = Pool.objects.create(name="zoomies-a", backend="process")
    Runner.objects.create(
        name="zoomies-a-1-slow", pool=pool, state="registering",
        created_at=now - timedelta(minutes=10, seconds=5), state_changed_at=now,
    )  # fmt: skip
    Runner.objects.create(
        name="zoomies-a-2-fresh", pool=pool, state="provisioning",
        created_at=now - timedelta(minutes=9), state_changed_at=now,
    )  # fmt: skip
    problems = call(live_server, "GET", "problems", tokens["read"]).json()["results"]
    stuck = [p for p in problems if p["key"] == "runners.not_progressing"]
    assert stuck and "zoomies-a-1-slow" in stuck[0]["detail"]
    assert "zoomies-a-2-fresh" not in stuck[0]["detail"]


def test_a_process_pool_refuses_an_image_that_would_run_an_arbitrary_command(live_server, tokens):
    body = {"name": "zoomies-sh", "labels": ["sh"], "backend": "process", "image": "/bin/sh"}
    response = call(live_server, "POST", "pools", tokens["write"], json=body)
    assert response.status_code == 400
    assert "process backend runs only" in response.text
    assert not Pool.objects.exists()
