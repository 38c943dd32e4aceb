"""The event stream: a transactional outbox, one relay per process, SSE and a websocket.

EVT-01 a change reaches the stream; EVT-02 written in the change's transaction (rolled
back: never announced); EVT-03 one relay tails the outbox whatever the viewers; EVT-04
resume from Last-Event-ID; EVT-05 frames are the API's GET shapes; EVT-06 overview and
problems sent only when they differ.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.test import AsyncClient

from fleet import actions as fleet_actions
from fleet.models import Host
from fleet.rest_api import HostSerializer, host_queryset
from runners import actions
from runners.actions import JobUpdate, apply_job_update
from runners.actions import pools as pool_actions
from runners.actions.lifecycle import NewRunner
from runners.api import RunnerSerializer, runner_queryset
from runners.housekeeping import housekeeping_step
from runners.models import Installation, Job, Pool, Runner
from runners.transitions import transition_runner
from tests.accounts.conftest import client_for
from zoomies_site import stream
from zoomies_site.consumers import UNAUTHENTICATED, EventConsumer
from zoomies_site.core.events import prune_events
from zoomies_site.core.models import Event
from zoomies_site.sse import event_frames

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_pool(name="zoomies-a") -> Pool:
    return pool_actions.create_pool(
        {"name": name, "labels": ["linux"], "backend": "process"}, actor="test", now=T0
    )


def make_runner(pool: Pool, host: Host | None = None, suffix="a") -> Runner:
    host = host or Host.objects.get_or_create(name="zoomies-h0", defaults={"capacity": 4})[0]
    installation = Installation.objects.get_or_create(github_id=1, account="acme")[0]
    new = NewRunner(
        name=f"{pool.name}-1-{suffix}", pool=pool, host_id=host.pk, installation=installation,
        image="", cpus=None, memory_mb=None, github_runner_id=None, env={}, command=None,
        reason="test",
    )  # fmt: skip
    return actions.create_runner(new, now=T0, actor="test")


def parse(text: str) -> list[dict]:
    """SSE text -> frames ({"id", "event", "data"}); comments and retry lines dropped."""
    frames = []
    for block in text.split("\n\n"):
        fields: dict = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            frames.append(
                {
                    "id": int(fields["id"]) if "id" in fields else None,
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            )
    return frames


def test_evt02_a_committed_change_writes_its_event_in_the_same_transaction():
    pool = make_pool()
    runner = make_runner(pool)
    kinds = list(Event.objects.order_by("pk").values_list("kind", "resource", "resource_id"))
    assert kinds == [
        ("pool.created", "pool", str(pool.pk)),
        ("runner.created", "runner", str(runner.pk)),
    ]
    transition_runner(runner.pk, "registering", now=T0, actor="test")
    assert Event.objects.order_by("-pk").first().kind == "runner.registering"


def test_evt02_a_rolled_back_change_is_never_announced():
    pool = make_pool()
    runner = make_runner(pool)
    relay = stream.Relay(clock=Clock())
    relay.prime()
    before = Event.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        transition_runner(runner.pk, "registering", now=T0, actor="test")
        raise RuntimeError("the action failed after its write")
    assert Event.objects.count() == before
    assert Runner.objects.get(pk=runner.pk).state == "provisioning"
    assert [f for f in relay.collect(T0) if f["event"] == "runner"] == []


def test_evt02_an_illegal_move_writes_no_event():
    pool = make_pool()
    runner = make_runner(pool)
    before = Event.objects.count()
    transition_runner(runner.pk, "idle", now=T0, actor="test")  # provisioning -> idle: refused
    transition_runner(runner.pk, "provisioning", now=T0, actor="test")  # repeated: no-op
    assert Event.objects.count() == before


def test_evt01_evt02_evt05_a_job_change_is_an_event_row_and_an_sse_frame_in_its_get_shape(cast):
    """EVT-01, EVT-02, EVT-05: a job recorded and moved on the webhook's and the poller's one
    path writes its event row in that transaction (rolled back: none), and the stream sends
    each change as a `job` frame whose object is what GET /api/v1/jobs/<id> answers."""
    make_pool()  # an event to resume after
    seen = Event.objects.latest("pk").pk
    queued = JobUpdate(
        github_id=77, run_id=1, repository="acme/app", name="build", labels=("self-hosted",),
        status="queued", created_at=T0,
    )  # fmt: skip
    started = JobUpdate(**{**queued.__dict__, "status": "in_progress", "started_at": T0})
    with pytest.raises(RuntimeError), transaction.atomic():
        apply_job_update(queued, installation=None, now=T0, source="webhook", actor="test")
        raise RuntimeError("the delivery failed after the job was recorded")
    assert not Job.objects.exists() and not Event.objects.filter(resource="job").exists()

    async def scenario():
        gen = event_frames(seen, keepalive=0.2)
        text = ""
        async with asyncio.timeout(20):
            while "event: problems" not in text:
                text += await anext(gen)
            await sync_to_async(apply_job_update)(
                queued, installation=None, now=T0, source="webhook", actor="test"
            )
            while "event: job" not in text:
                text += await anext(gen)
            await sync_to_async(apply_job_update)(
                started, installation=None, now=T0, source="poller", actor="system:poller"
            )
            while text.count("event: job") < 2:
                text += await anext(gen)
        await gen.aclose()
        return text

    frames = [f for f in parse(async_to_sync(scenario)()) if f["event"] == "job"]
    job = Job.objects.get(github_id=77)
    rows = Event.objects.filter(resource="job").order_by("pk")
    assert list(rows.values_list("kind", "resource_id")) == [
        ("job.queued", str(job.pk)), ("job.in_progress", str(job.pk))
    ]  # fmt: skip
    assert [(f["id"], f["data"]["kind"], f["data"]["id"]) for f in frames] == [
        (event.pk, event.kind, job.pk) for event in rows
    ]
    assert frames[0]["data"]["object"]["status"] == "queued"
    got = client_for(cast["viewer"]).get(f"/api/v1/jobs/{job.pk}").json()
    assert frames[1]["data"]["object"] == got and got["status"] == "in_progress"


def test_evt05_each_frame_is_the_api_get_shape(django_assert_max_num_queries):
    host = Host.objects.create(name="zoomies-h", capacity=2, backends=["process"])
    pool = make_pool()
    relay = stream.Relay(clock=Clock())
    relay.prime()
    runner = make_runner(pool, host)
    fleet_actions.set_host_cordon(host=host, cordoned=True, now=T0, actor="test")
    for i in range(10):
        make_runner(pool, host, suffix=f"n{i}")
    events = list(Event.objects.order_by("pk"))
    # One query per resource type, however many rows changed (the relay renders each once).
    with django_assert_max_num_queries(3):
        stream.render(events)
    frames = relay.collect(T0)
    assert len([f for f in frames if f["event"] == "runner"]) == 11
    by_event = {(f["event"], f["data"].get("id")): f for f in frames if f["id"]}
    by_event["runner"], by_event["host"] = by_event["runner", runner.pk], by_event["host", host.pk]
    assert (
        by_event["runner"]["data"]["object"]
        == RunnerSerializer(runner_queryset().get(pk=runner.pk)).data
    )
    assert (
        by_event["host"]["data"]["object"] == HostSerializer(host_queryset().get(pk=host.pk)).data
    )
    assert by_event["host"]["data"]["object"]["cordoned"] is True
    assert by_event["runner"]["data"]["kind"] == "runner.created"


def test_evt05_a_deleted_row_is_a_frame_with_no_object():
    pool = make_pool("zoomies-gone")
    pk = pool.pk
    relay = stream.Relay(clock=Clock())
    relay.prime()
    pool_actions.delete_pool(pool, actor="test", now=T0)
    frames = [f for f in relay.collect(T0) if f["event"] == "pool"]
    assert [f["data"] for f in frames] == [{"kind": "pool.deleted", "id": pk, "object": None}]


def test_evt03_the_relay_reads_each_event_once_and_moves_on():
    relay = stream.Relay(clock=Clock())
    relay.prime()
    pool = make_pool()
    first = relay.collect(T0)
    assert [f["data"]["id"] for f in first if f["event"] == "pool"] == [pool.pk]
    assert [f for f in relay.collect(T0) if f["event"] == "pool"] == []


def test_evt03_an_id_that_commits_late_is_still_sent():
    """PostgreSQL hands out ids before commit: a lower id may appear after a higher one."""
    relay = stream.Relay(clock=Clock())
    relay.prime()
    pool = make_pool()
    early = Event.objects.get(resource="pool", resource_id=str(pool.pk))
    late_id = early.pk + 1
    later = Event.objects.create(
        id=late_id + 1, kind="pool.updated", resource="pool", resource_id=str(pool.pk),
        created_at=T0,
    )  # fmt: skip
    relay.collect(T0)
    assert relay.gaps == {late_id: 0.0}
    other = make_pool("zoomies-b")
    Event.objects.filter(resource_id=str(other.pk)).update(id=late_id)
    frames = relay.collect(T0)
    assert [f["data"]["id"] for f in frames if f["event"] == "pool"] == [other.pk]
    assert relay.gaps == {} and relay.cursor >= later.pk


def test_evt03_a_jump_in_ids_waits_on_a_bounded_window_only():
    """A sequence that jumped (rows pruned, transactions rolled back) is not a million gaps."""
    pool = make_pool()
    relay = stream.Relay(clock=Clock())
    relay.prime()
    start = relay.cursor
    far = start + 10 * stream.MAX_GAPS
    Event.objects.create(
        id=far, kind="pool.updated", resource="pool", resource_id=str(pool.pk), created_at=T0
    )
    frames = relay.collect(T0)
    assert [f["data"]["id"] for f in frames if f["event"] == "pool"] == [pool.pk]
    assert len(relay.gaps) == stream.MAX_GAPS and min(relay.gaps) == far - stream.MAX_GAPS


def test_evt06_overview_and_problems_are_sent_only_when_they_change():
    clock = Clock()
    relay = stream.Relay(clock=clock)
    relay.prime()
    first = {f["event"] for f in relay.collect(T0)}
    assert {"overview", "problems"} <= first
    clock.now += stream.SUMMARY_EVERY + 1
    assert relay.collect(T0) == []  # recomputed, unchanged: nothing sent
    make_runner(make_pool())
    frames = relay.collect(T0)
    overview = [f for f in frames if f["event"] == "overview"]
    assert overview and overview[0]["data"]["runners_by_state"]["provisioning"] == 1


def test_the_outbox_keeps_an_hour_and_always_its_newest_row():
    make_pool()
    make_pool("zoomies-b")
    Event.objects.update(created_at=T0 - timedelta(hours=2))
    assert prune_events(T0) == 1
    assert Event.objects.count() == 1


def test_evt04_a_resuming_client_gets_what_it_missed_and_a_pruned_one_is_told_to_reload():
    pool = make_pool()
    seen = Event.objects.latest("pk").pk
    runner = make_runner(pool)
    transition_runner(runner.pk, "registering", now=T0, actor="test")
    frames, reset = stream.backlog(seen)
    assert not reset
    assert [(f["event"], f["data"]["kind"]) for f in frames] == [("runner", "runner.registering")]
    assert frames[0]["data"]["object"]["state"] == "registering"
    Event.objects.filter(pk__lte=seen + 1).delete()
    assert stream.backlog(seen - 1) == ([], True)


async def _read(gen, until):
    """Chunks from an SSE generator until `until(text)` holds (bounded by a timeout)."""
    text = ""
    try:
        async with asyncio.timeout(20):
            async for chunk in gen:
                text += chunk.decode() if isinstance(chunk, bytes) else chunk
                if until(text):
                    return text
    finally:
        await gen.aclose()
    return text


def test_evt01_evt04_the_stream_resumes_after_last_event_id_then_sends_live_changes(cast):
    pool = make_pool()
    seen = Event.objects.latest("pk").pk
    runner = make_runner(pool)

    async def scenario():
        gen = event_frames(seen, keepalive=0.2)
        text = ""
        async with asyncio.timeout(20):
            while "event: problems" not in text:
                text += await anext(gen)
            # Now a change committed after connecting arrives from the relay, live.
            await sync_to_async(transition_runner)(runner.pk, "registering", now=T0, actor="t")
            while text.count("event: runner") < 2:
                text += await anext(gen)
            while ": keep-alive" not in text:
                text += await anext(gen)
        await gen.aclose()
        return text

    text = async_to_sync(scenario)()
    frames = parse(text)
    runner_frames = [f for f in frames if f["event"] == "runner"]
    assert runner_frames[0]["data"]["kind"] == "runner.created"
    assert runner_frames[0]["id"] > seen
    assert runner_frames[1]["data"]["object"]["state"] == "registering"
    assert runner_frames[1]["id"] > runner_frames[0]["id"]
    assert text.startswith("retry: ")


def test_evt04_the_view_reads_last_event_id_and_refuses_a_bad_one(cast):

    viewer = client_for(cast["viewer"])
    assert viewer.get("/api/v1/events", headers={"Last-Event-ID": "x"}).status_code == 400
    assert client_for().get("/api/v1/events").status_code == 401
    pool = make_pool()
    seen = Event.objects.latest("pk").pk
    pool_actions.set_pool_paused(pool, paused=True, actor="test", now=T0)

    async def scenario():
        client = AsyncClient()
        await client.aforce_login(cast["viewer"])
        response = await client.get("/api/v1/events", headers={"Last-Event-ID": str(seen)})
        assert response.status_code == 200
        assert response["Content-Type"] == "text/event-stream"
        return await _read(aiter(response.streaming_content), lambda t: "event: pool" in t)

    text = async_to_sync(scenario)()
    pool_frames = [f for f in parse(text) if f["event"] == "pool"]
    assert pool_frames[0]["data"]["kind"] == "pool.paused"
    assert pool_frames[0]["data"]["object"]["paused"] is True


# Channels' test communicator runs the consumer's sync calls on a thread of its own, which
# sees only committed rows: this test commits for real.
@pytest.mark.django_db(transaction=True)
def test_evt03_the_admin_websocket_gets_the_same_frames_from_the_relay(cast):

    pool = make_pool()

    async def scenario():
        anonymous = WebsocketCommunicator(EventConsumer.as_asgi(), "/ws/events")
        anonymous.scope["user"] = AnonymousUser()
        connected, code = await anonymous.connect()
        assert (connected, code) == (False, UNAUTHENTICATED)

        ws = WebsocketCommunicator(EventConsumer.as_asgi(), "/ws/events")
        ws.scope["user"] = cast["viewer"]
        connected, _ = await ws.connect()
        assert connected
        first = [await ws.receive_json_from(timeout=10) for _ in range(2)]
        assert [f["event"] for f in first] == ["overview", "problems"]
        await sync_to_async(pool_actions.set_pool_paused)(pool, paused=True, actor="test", now=T0)
        while True:
            frame = await ws.receive_json_from(timeout=10)
            if frame["event"] == "pool":
                break
        await ws.disconnect()
        return frame

    frame = async_to_sync(scenario)()
    assert frame["data"]["kind"] == "pool.paused"
    assert frame["data"]["object"]["paused"] is True


def test_housekeeping_prunes_the_outbox():

    make_pool()
    make_pool("zoomies-b")
    Event.objects.update(created_at=T0 - timedelta(hours=3))
    report = housekeeping_step(T0)
    assert "pruned 1 event(s) older than the outbox's retention" in report.lines
    assert Event.objects.count() == 1


def test_evt01_a_pool_changed_in_the_admin_is_announced_like_one_changed_by_the_api(cast):

    pool = make_pool()
    relay = stream.Relay(clock=Clock())
    relay.prime()
    form = {
        "name": "zoomies-a", "repository": "", "labels": '["linux"]', "backend": "process",
        "platform": "", "host_selector": "{}", "image": "", "cpus": "", "memory_mb": "",
        "warm": "0", "max_runners": "7", "idle_timeout": "", "runner_group_id": "1",
        "ephemeral": "on",
    }  # fmt: skip
    admin = client_for(cast["admin"])
    answer = admin.post(f"/admin/runners/pool/{pool.pk}/change/", form)
    assert answer.status_code == 302, answer.content[:2000]
    frames = [f for f in relay.collect(T0) if f["event"] == "pool"]
    assert [f["data"]["kind"] for f in frames] == ["pool.updated"]
    assert frames[0]["data"]["object"]["max_runners"] == 7
    admin.post(f"/admin/runners/pool/{pool.pk}/delete/", {"post": "yes"})
    frames = [f for f in relay.collect(T0) if f["event"] == "pool"]
    assert [(f["data"]["kind"], f["data"]["object"]) for f in frames] == [("pool.deleted", None)]


def test_evt03_an_unwatched_relay_stops_tailing_and_the_next_viewer_starts_it_again():
    clock = Clock()

    async def scenario():
        relay = stream.Relay(poll=0.01, clock=clock)
        relay.subscribe()
        await asyncio.sleep(0.05)
        assert not relay.task.done()  # watched: it keeps tailing
        relay.unsubscribe()
        clock.now += stream.IDLE_STOP + 1
        async with asyncio.timeout(10):
            while not relay.task.done():
                await asyncio.sleep(0.01)
        assert relay.cursor is None
        relay.subscribe()
        assert not relay.task.done()
        relay.task.cancel()

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_evt03_a_committed_event_wakes_the_relay_before_its_poll():
    """EVT-03: the relay looks when an event commits (a wake from the writing thread, as from
    another process), not only at its poll: with the poll at 60 s the frame still arrives
    before the test's 20 s deadline."""
    from channels.layers import get_channel_layer  # noqa: PLC0415

    pool = make_pool()

    async def scenario():
        relay = stream.Relay(poll=60)
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(relay.group, channel)
        relay.subscribe()
        try:
            # Primed and through its first look: now in its 60 s pause.
            async with asyncio.timeout(20):
                while relay.cursor is None or relay.summary is None:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0)
            await sync_to_async(pool_actions.set_pool_paused)(
                pool, paused=True, actor="test", now=T0
            )
            async with asyncio.timeout(20):
                while True:
                    message = await layer.receive(channel)
                    if message["frame"]["event"] == "pool":
                        return message["frame"]
        finally:
            relay.task.cancel()

    frame = async_to_sync(scenario)()
    assert frame["data"]["kind"] == "pool.paused"
