"""The agent protocol's hot routes under ASGI (fleet/agent_asgi.py) and the cheap heartbeat.

The routes are called through zoomies_site.asgi.application as daphne calls it, in this
process: join, heartbeat, reports and task results run on the agent pool's own threads,
never on Django's thread-sensitive executor; a busy database is a 503 with Retry-After;
a heartbeat that reports nothing new within the coalescing window writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import actions, agent_asgi, task_results
from fleet.health import check_host_health
from fleet.models import Host
from runners import host_facts
from tests.fleet.conftest import FACTS, T0, join
from zoomies_site.asgi import application
from zoomies_site.core import registry

pytestmark = pytest.mark.usefixtures("registry_defaults", "fresh_agent_pool")


@pytest.fixture
def fresh_agent_pool(monkeypatch):
    """A pool of the module's own kind for each test, so no thread keeps a connection (or
    its settings) from another test."""
    pools = {
        "_run_view_async": ThreadPoolExecutor(2, thread_name_prefix=agent_asgi.THREAD_PREFIX),
        "_run_join_async": ThreadPoolExecutor(1, thread_name_prefix=agent_asgi.JOIN_THREAD_PREFIX),
    }
    for name, pool in pools.items():
        run = sync_to_async(agent_asgi._run_view, thread_sensitive=False, executor=pool)
        monkeypatch.setattr(agent_asgi, name, run)
    yield
    for pool in pools.values():
        for _ in range(2):
            pool.submit(agent_asgi.close_connections)
        pool.shutdown(wait=True)


def call(path: str, body: dict | None = None, *, token: str | None = None, method="POST"):
    """(status, headers, JSON body) of one request to the controller's ASGI application."""
    content = json.dumps(body if body is not None else {}).encode()
    length = str(len(content)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", length)]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": headers, "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }  # fmt: skip
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": content, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(application(scope, receive, send))
    start = sent[0]
    answer = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), json.loads(answer) if answer else None


def threads_of(monkeypatch, name: str, module=actions) -> list[str]:
    """Record the name of the thread each call of <module>.<name> runs on."""
    seen: list[str] = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


def test_the_hot_agent_routes_are_routed_to_the_agent_pool_and_nothing_else():
    def scope(method: str, path: str) -> dict:
        return {"type": "http", "method": method, "path": path, "root_path": ""}

    for path in ("join", "heartbeat", "reports", "tasks/7/result", "tasks/results"):
        assert agent_asgi.handles(scope("POST", "/api/v1/agent/" + path)), path
        assert not agent_asgi.handles(scope("GET", "/api/v1/agent/" + path)), path
    # The long-poll, on the event loop without Django's handler; the rest is Django's.
    assert agent_asgi.handles(scope("GET", "/api/v1/agent/tasks"))
    assert not agent_asgi.handles(scope("POST", "/api/v1/agent/tasks"))
    assert not agent_asgi.handles(scope("DELETE", "/api/v1/agent/tasks"))
    assert not agent_asgi.handles(scope("POST", "/api/v1/agent/tasks/x/result"))
    assert not agent_asgi.handles(scope("POST", "/webhooks/github"))
    assert not agent_asgi.handles(scope("POST", "/api/v1/hosts"))
    assert not agent_asgi.handles({"type": "websocket", "path": "/api/v1/agent/heartbeat"})


@pytest.mark.django_db(transaction=True)
def test_join_and_heartbeat_run_on_the_agent_pool_threads(monkeypatch):
    joins = threads_of(monkeypatch, "join_host")
    beats = threads_of(monkeypatch, "record_heartbeat")
    _, secret = actions.create_join_token(now=timezone.now(), actor="user:test")
    status, headers, body = call(
        "/api/v1/agent/join", {"join_token": secret, "name": "h1", **FACTS}
    )
    assert status == 200, body
    assert headers[b"x-content-type-options"] == b"nosniff"
    token = body["agent_token"]
    status, _, answer = call("/api/v1/agent/heartbeat", {"capacity": 5}, token=token)
    assert status == 200 and answer["heartbeat_interval"] == 30
    assert Host.objects.get(name="h1").capacity == 5
    assert joins and beats
    # Joins on their own thread, so a burst of them never holds a heartbeat back.
    assert all(name.startswith(agent_asgi.JOIN_THREAD_PREFIX) for name in joins), joins
    assert all(name.startswith(agent_asgi.THREAD_PREFIX + "_") for name in beats), beats
    # The views' own answers come through: a wrong token is the protocol's 401.
    status, headers, body = call("/api/v1/agent/heartbeat", {}, token="zat_nope")
    assert status == 401 and body["error"] and headers[b"www-authenticate"] == b"Bearer"


@pytest.mark.django_db(transaction=True)
def test_reports_and_task_results_run_on_the_agent_pool_threads(monkeypatch):
    results = threads_of(monkeypatch, "record_task_result", task_results)
    reported: list[str] = []

    real = host_facts.apply_reports

    def recording(**kwargs):
        reported.append(threading.current_thread().name)
        return real(**kwargs)

    monkeypatch.setattr(host_facts, "apply_reports", recording)
    _, token = join("h1")
    status, _, body = call("/api/v1/agent/reports", {"reports": []}, token=token)
    assert status == 200 and body == {"accepted": [], "refused": []}
    status, _, body = call("/api/v1/agent/tasks/424242/result", {"ok": True}, token=token)
    assert status == 404 and body["error"]
    assert reported and results
    assert all(n.startswith(agent_asgi.THREAD_PREFIX) for n in reported + results)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", ["heartbeat", "join"])
@pytest.mark.parametrize(
    "refusal",
    [
        "database is locked",
        # The store drill's outage (tests/e2e/test_drills_recovery.py): the file, or its
        # -wal/-shm, made read-only under a running controller.
        "attempt to write a readonly database",
        "disk I/O error",
        "database or disk is full",
    ],
)
def test_a_busy_database_answers_503_with_retry_after_never_500(monkeypatch, route, refusal):
    _, token = join("h1")
    _, secret = actions.create_join_token(now=timezone.now(), actor="user:test")

    def locked(**kwargs):
        raise OperationalError(refusal)

    monkeypatch.setattr(
        actions, "record_heartbeat" if route == "heartbeat" else "join_host", locked
    )
    body = {"join_token": secret, "name": "h2", **FACTS} if route == "join" else {}
    status, headers, answer = call(f"/api/v1/agent/{route}", body, token=token)
    assert status == 503
    assert headers[b"retry-after"] == b"5"
    assert "busy" in answer["error"]
    assert not Host.objects.filter(name="h2").exists()


@pytest.mark.django_db(transaction=True)
def test_a_real_write_lock_past_the_busy_timeout_is_a_503(monkeypatch):
    """SQLite itself refusing the write (its busy timeout spent) is the same 503."""
    if connection.vendor != "sqlite":
        pytest.skip("the write lock under test is SQLite's")
    _, token = join("h1")
    # Another connection holds the write lock, and this one waits no time for it.
    holder = type(connections["default"])(
        {**connection.settings_dict, "OPTIONS": {**connection.settings_dict["OPTIONS"]}},
        alias="holder",
    )
    holder.connect()
    # The fresh pool's thread opens its connection with no time to wait for the lock.
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0)
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN IMMEDIATE")
            cursor.execute("UPDATE fleet_host SET capacity = 1")
            status, headers, answer = call("/api/v1/agent/heartbeat", {"capacity": 9}, token=token)
            cursor.execute("ROLLBACK")
    finally:
        holder.close()
    assert status == 503 and headers[b"retry-after"] == b"5", answer
    assert Host.objects.get(name="h1").capacity == FACTS["capacity"]


def writes(queries) -> list[str]:
    return [
        q["sql"]
        for q in queries
        if q["sql"].split()[0].upper() in ("UPDATE", "INSERT", "SAVEPOINT")
    ]


@pytest.mark.django_db
def test_host01_a_heartbeat_within_the_coalescing_window_writes_nothing():
    host, _ = join("h1")
    actions.record_heartbeat(host=host, facts={}, now=T0 + timedelta(seconds=30))
    host.refresh_from_db()
    window = actions.heartbeat_coalesce_window()
    assert window == timedelta(seconds=10)  # a third of the 30 s interval
    with CaptureQueriesContext(connection) as queries:
        answer = actions.record_heartbeat(
            host=host, facts={"usage": {"cpu": 0.5}}, now=T0 + timedelta(seconds=39)
        )
    assert answer["heartbeat_interval"] == 30
    assert writes(queries) == [], writes(queries)
    host.refresh_from_db()
    assert host.last_heartbeat_at == T0 + timedelta(seconds=30)


@pytest.mark.django_db
def test_a_heartbeat_past_the_window_writes_one_update_and_a_new_fact_is_always_written():
    host, _ = join("h1")
    actions.record_heartbeat(host=host, facts={}, now=T0 + timedelta(seconds=30))
    host.refresh_from_db()
    with CaptureQueriesContext(connection) as queries:
        actions.record_heartbeat(host=host, facts={}, now=T0 + timedelta(seconds=40))
    assert len(writes(queries)) == 1 and "last_heartbeat_at" in writes(queries)[0]
    host.refresh_from_db()
    assert host.last_heartbeat_at == T0 + timedelta(seconds=40)
    # Within the window, but a fact moved: it is written.
    actions.record_heartbeat(host=host, facts={"capacity": 9}, now=T0 + timedelta(seconds=41))
    host.refresh_from_db()
    assert host.capacity == 9 and host.last_heartbeat_at == T0 + timedelta(seconds=41)


@pytest.mark.django_db
def test_a_heartbeat_within_the_window_still_heals_an_unhealthy_host_and_tells_a_cordon():
    host, _ = join("h1")
    actions.record_heartbeat(host=host, facts={}, now=T0 + timedelta(seconds=30))
    host.refresh_from_db()  # this copy says healthy, fresh, not cordoned
    Host.objects.filter(pk=host.pk).update(health="unhealthy", cordoned=True)
    answer = actions.record_heartbeat(host=host, facts={}, now=T0 + timedelta(seconds=31))
    host.refresh_from_db()
    assert host.health == "healthy" and answer["cordoned"] is True


@pytest.mark.django_db
def test_host03_a_host_heartbeating_on_time_is_never_judged_silent_despite_coalescing():
    """HOST-03: with heartbeats every interval (some late by a few seconds, some repeated
    within the window), the recorded mark never ages to the 90 s timeout."""
    host, _ = join("h1")
    beats = []
    t, late = 5, False
    while t < 600:
        beats += [t, t + 4]  # a repeat inside the window, written or not
        t += 37 if late else 30  # every other one 7 s late
        late = not late
    beat_index = 0
    for second in range(600):
        now = T0 + timedelta(seconds=second)
        while beat_index < len(beats) and beats[beat_index] <= second:
            current = Host.objects.get(pk=host.pk)
            actions.record_heartbeat(host=current, facts={}, now=now)
            beat_index += 1
        assert check_host_health(now) == [], second
    assert Host.objects.get(pk=host.pk).health == "healthy"


@pytest.mark.django_db
def test_the_coalescing_window_stays_inside_the_timeout_for_a_long_interval(monkeypatch):
    """An interval close to the timeout (validation only warns) shrinks the window."""

    monkeypatch.setenv(registry.env_name("agent.heartbeat_interval"), "80s")
    registry.reload()
    window = actions.heartbeat_coalesce_window()
    interval = registry.get("agent.heartbeat_interval")
    assert interval + window < registry.get("agent.heartbeat_timeout")


@pytest.mark.django_db(transaction=True)
def test_a_database_fault_that_is_not_busy_is_not_dressed_up_as_a_503(monkeypatch, caplog):
    """A missing table is a fault to fix, not a reason for the agent to retry."""
    _, token = join("h1")

    def broken(**kwargs):
        raise OperationalError("no such table: fleet_host")

    monkeypatch.setattr(actions, "record_heartbeat", broken)
    status, _, answer = call("/api/v1/agent/heartbeat", {}, token=token)
    assert status == 500 and answer["error"]
    assert "no such table" in caplog.text


def long_poll_scope(query: bytes, token: str | None) -> dict:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/api/v1/agent/tasks", "raw_path": b"/api/v1/agent/tasks",
        "root_path": "", "query_string": query, "headers": headers,
        "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_answers_on_the_event_loop_without_a_thread_of_its_own(monkeypatch):
    """Issue 28: through Django's handler each long-poll ran in a ThreadSensitiveContext and
    got a thread started and joined on the event loop; at 1,000 agents heartbeats waited
    seconds behind them. The view answers as before (its body, a 401, a 400) with none."""
    from asgiref import sync  # noqa: PLC0415

    contexts: list[object] = []
    real_enter = sync.ThreadSensitiveContext.__aenter__

    async def counted(self):
        contexts.append(self)
        return await real_enter(self)

    monkeypatch.setattr(sync.ThreadSensitiveContext, "__aenter__", counted)
    _host, token = join("h1")

    def poll(query: bytes, token: str | None):
        sent: list[dict] = []
        asked = 0

        async def receive():  # as daphne: the request, then nothing until a disconnect
            nonlocal asked
            asked += 1
            if asked > 1:
                await asyncio.Event().wait()
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        asyncio.run(application(long_poll_scope(query, token), receive, send))
        body = b"".join(m.get("body", b"") for m in sent[1:])
        return sent[0]["status"], dict(sent[0]["headers"]), json.loads(body)

    status, headers, body = poll(b"wait=0", token)
    assert status == 200 and body["tasks"] == []
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert poll(b"wait=0", "zat_nope")[0] == 401
    status, _, body = poll(b"wait=nope", token)
    assert status == 400 and "wait" in json.dumps(body)
    assert contexts == []


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_whose_agent_goes_away_ends_at_once_and_answers_nothing():
    _host, token = join("h1")
    sent: list[dict] = []
    asked = 0

    async def receive():
        nonlocal asked
        asked += 1
        if asked == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(0.2)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def run():
        await asyncio.wait_for(application(long_poll_scope(b"wait=25", token), receive, send), 10)

    asyncio.run(run())
    assert sent == [] and asked == 2
