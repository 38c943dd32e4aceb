"""The agent API on any input: a clear 4xx naming the field, never a 500 or a traceback
(issue 8 items 3 and 4, agent part); and the timings every join and heartbeat answer carries
(issue 7 item 5).

Through Django's test client (no socket needed for this): `raise_request_exception=False`
so a 500 would be seen as the status an agent gets, and the log is watched for tracebacks.
"""

from __future__ import annotations

import json
import logging
import string

import pytest
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet import actions
from fleet.models import Host
from tests.fleet.conftest import FACTS, T0, join
from zoomies_site.core import registry

pytestmark = pytest.mark.usefixtures("registry_defaults")
API = "/api/v1/agent/"


@pytest.fixture
def http() -> Client:
    return Client(raise_request_exception=False)


def post(http: Client, path: str, body: bytes | str | dict, token: str | None = None, **kw):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http.post(API + path, data=data, content_type="application/json", headers=headers)


def no_tracebacks(caplog) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.exc_info or r.levelno >= logging.ERROR
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("heartbeat", {"capacity": 2**63}, "capacity"),
        ("heartbeat", {"capacity": 2**64 + 5}, "capacity"),
        ("heartbeat", {"disk_free_mb": 2**63}, "disk_free_mb"),
        ("heartbeat", {"memory_mb": 2**31}, "memory_mb"),
        ("heartbeat", {"cpus": "eight"}, "cpus"),
        ("heartbeat", {"labels": {"zone": None}}, "labels.zone"),
        ("heartbeat", {"version": "x\u0000y"}, "version"),
        ("heartbeat", '{"platform": "\\ud800"}', "platform"),
        ("heartbeat", b'{"cpus": NaN}', "$"),
        ("heartbeat", b'{"cpus": 1e999}', "$"),
        ("heartbeat", b'{"labels": ' + b"[" * 1200 + b"]" * 1200 + b"}", "$"),
        ("heartbeat", b"[" * 100_000, "$"),
        ("heartbeat", b"not json", "$"),
        ("heartbeat", b"[]", "$"),
        ("reports", {"reports": [{"runner_id": 2**63}]}, "reports[0].runner_id"),
        ("reports", {"reports": [{"runner_id": "5"}]}, "reports[0].runner_id"),
        ("reports", {"reports": [{"runner_id": 5, "exit_code": 2**63}]}, "reports[0].exit_code"),
        ("reports", {"reports": [{"runner_id": 5, "message": 7}]}, "reports[0].message"),
        ("reports", {}, "reports"),
        ("tasks/1/result", {"ok": "yes"}, "ok"),
        ("tasks/1/result", {"ok": True, "attempt": 2**63}, "attempt"),
        ("tasks/1/result", {"ok": False, "error": {"a": 1}}, "error"),
    ],
)  # fmt: skip
def test_an_authenticated_call_out_of_shape_is_a_400_naming_the_field(
    http, caplog, path, body, field
):
    """ARCH-07, issue 8 item 3: numbers above 2^63, NaN, deep JSON and wrong types."""
    host, token = join("h1", now=T0)
    before = Host.objects.values().get(pk=host.pk)
    answer = post(http, path, body, token)
    assert answer.status_code == 400, answer.content
    error = answer.json()
    assert error["field"] == field and error["error"].startswith(f"{field}: ")
    assert Host.objects.values().get(pk=host.pk) == before, "nothing was written"
    assert no_tracebacks(caplog) == []


@pytest.mark.django_db
def test_a_join_out_of_shape_is_a_400_and_spends_no_token(http, caplog):
    _, secret = actions.create_join_token(now=timezone.now(), actor="user:test")
    deep = b'{"join_token": "' + secret.encode() + b'", "name": "h", "labels": '
    deep += b"[" * 1500 + b"]" * 1500 + b"}"
    for body, field in [
        (deep, "$"),
        ({"join_token": secret, "name": "h", "capacity": 2**63}, "capacity"),
        ({"join_token": secret, "name": "../etc"}, "name"),
        ({"join_token": secret, "name": ["h"]}, "name"),
    ]:
        answer = post(http, "join", body)
        assert answer.status_code == 400, answer.content
        assert answer.json()["field"] == field
    # The token was not spent by any of them.
    good = post(http, "join", {"join_token": secret, "name": "h", **FACTS})
    assert good.status_code == 200, good.content
    assert no_tracebacks(caplog) == []


@pytest.mark.django_db
def test_a_task_id_beyond_any_row_is_404_not_an_overflow(http, caplog):
    _, token = join("h1", now=T0)
    for task_id in (2**63, 2**64, 10**30):
        answer = post(http, f"tasks/{task_id}/result", {"ok": True}, token)
        assert answer.status_code == 404, answer.content
        assert "error" in answer.json()
    assert no_tracebacks(caplog) == []


@pytest.mark.django_db
def test_every_agent_route_answers_a_wrong_method_with_the_protocols_json_405(http):
    """Issue 8 item 4: `POST tasks` is JSON 405 (it was the CSRF middleware's HTML 403)."""
    # A client that enforces CSRF, as a browser-less agent meets it in production.
    strict = Client(enforce_csrf_checks=True, raise_request_exception=False)
    answer = strict.post(API + "tasks", data="{}", content_type="application/json")
    assert answer.status_code == 405, answer.content[:200]
    assert answer["Content-Type"] == "application/json"
    assert answer["Allow"] == "GET" and "error" in answer.json()
    for path in ("join", "heartbeat", "reports", "tasks/1/result", "tasks/results"):
        answer = strict.get(API + path)
        assert answer.status_code == 405 and answer["Allow"] == "POST"
        assert "error" in answer.json()


@pytest.mark.django_db
def test_host01_agent16_agent17_agent19_the_answers_carry_the_controllers_timings(
    http, monkeypatch
):
    """HOST-01, AGENT-16, AGENT-17, AGENT-18, AGENT-19: the agent's timings are the
    controller's settings, sent in every join and heartbeat answer, so no agent-side copy
    has to be kept equal to them."""
    for key, value in [
        ("agent.heartbeat_interval", "20s"),
        ("agent.long_poll_wait", "10s"),
        ("agent.orphan_grace", "5m"),
        ("agent.missing_grace", "90s"),
        ("agent.shutdown_grace", "45s"),
        ("agent.finished_retention", "1h"),
    ]:
        monkeypatch.setenv(registry.env_name(key), value)
    registry.reload()
    _, secret = actions.create_join_token(now=timezone.now(), actor="user:test")
    joined = post(http, "join", {"join_token": secret, "name": "h1"}).json()
    beat = post(http, "heartbeat", {}, joined["agent_token"]).json()
    expected = {
        "heartbeat_interval": 20.0,
        "long_poll_wait": 10.0,
        "orphan_grace": 300.0,
        "missing_grace": 90.0,
        "shutdown_grace": 45.0,
        "finished_retention": 3600.0,
    }
    assert {k: joined[k] for k in expected} == expected
    assert {k: beat[k] for k in expected} == expected and beat["cordoned"] is False


# -- the fuzz -----------------------------------------------------------------------------

KEYS = [
    "join_token", "claim_code", "name", "capacity", "backends", "platform", "cpus",
    "memory_mb", "labels", "version", "disk_total_mb", "disk_free_mb", "usage", "ok", "error",
    "attempt", "reports", "runner_id", "state", "phase", "exit_code", "message", "results", "id",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**70),
    st.integers(max_value=-(2**62)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["registering", "removed", "failed", "running", "process", "h1", "\x00"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=12,
)
reports = st.fixed_dictionaries(
    {"runner_id": values},
    optional={"state": values, "phase": values, "exit_code": values, "message": values},
)
results = st.fixed_dictionaries(
    {"id": values}, optional={"ok": values, "error": values, "attempt": values}
)
bodies = st.one_of(
    values.map(lambda v: json.dumps(v).encode()),  # NaN and Infinity included
    st.dictionaries(st.sampled_from(KEYS), values, max_size=8).map(lambda v: json.dumps(v)),
    st.lists(reports, max_size=3).map(lambda r: json.dumps({"reports": r})),
    st.lists(results, max_size=3).map(lambda r: json.dumps({"results": r})),
    st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n),
    st.binary(max_size=40),
)
paths = st.one_of(
    st.sampled_from(["join", "heartbeat", "reports", "tasks", "tasks/results"]),
    st.integers(min_value=0, max_value=2**80).map(lambda n: f"tasks/{n}/result"),
)
waits = st.one_of(st.none(), st.text(string.printable, max_size=6), st.sampled_from(["nan", "-1"]))


@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=paths,
    body=bodies,
    auth=st.sampled_from(["host", "none", "garbage"]),
    method=st.sampled_from(["POST", "POST", "GET"]),
    wait=waits,
)
def test_random_agent_calls_never_earn_a_5xx_or_a_traceback(
    http, caplog, path, body, auth, method, wait
):
    """Issue 8 acceptance: random agent calls, signed in and not, get no 5xx and log no
    traceback."""
    caplog.clear()
    host = Host.objects.filter(name="fuzz-host").first()
    token = None
    if auth == "host":
        host, token = (
            join("fuzz-host", now=T0) if host is None else actions.join_host(
                join_token=actions.create_join_token(now=T0, actor="user:test")[1],
                name="fuzz-host", facts={}, now=T0,
            )
        )  # fmt: skip
    elif auth == "garbage":
        token = "zat_" + "x" * 40
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if method == "GET" or path == "tasks" and method != "POST":
        query = {} if wait is None else {"wait": wait}
        if path == "tasks":
            query["wait"] = "0"  # a real wait would only slow the fuzz
        answer = http.get(API + path, query, headers=headers)
    else:
        answer = http.post(API + path, data=body, content_type="application/json", headers=headers)
    assert answer.status_code < 500, (path, body, answer.content[:300])
    assert answer["Content-Type"] == "application/json", answer.content[:300]
    assert no_tracebacks(caplog) == [], (path, body)
