"""The redelivery pass against the fake GitHub over real sockets.

Deliveries GitHub tried and that failed (dropped on the way, or answered 503 by a stalled
Zoomies) are listed by the pass, asked for again once each, and arrive at the webhook as
redeliveries under their own X-GitHub-Delivery (HOOK-02). One clock is shared by the fake,
the client and each pass's `now`, so time moves instead of passing.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError

from accounts.models import AuditLog
from runners import redelivery, webhooks
from runners.github.client import GitHubApp
from runners.models import Job, RedeliveryRequest, RedeliveryState, WebhookDelivery
from runners.redelivery import MAX_ASKS, redelivery_step
from runners.tasks import redelivery_task
from tests.runners.conftest import install
from zoomies_site import ticker
from zoomies_site.core import leases, registry

LABELS = ["self-hosted", "linux"]
ATTEMPTS = "/attempts"


@pytest.fixture(autouse=True)
def _isolated(github_settings):
    return github_settings


@pytest.fixture
def fake(silent_github):
    return silent_github


@pytest.fixture
def clock(github_clock):
    return github_clock


def run_pass(app, clock):
    return redelivery_step(clock.now(), app=app, clock=clock)


def asks(fake) -> list[str]:
    return [path for method, path, _ in fake.calls if method == "POST" and path.endswith(ATTEMPTS)]


@pytest.mark.django_db(transaction=True)
def test_hook02_failed_deliveries_arrive_as_redeliveries_and_a_second_pass_asks_nothing(
    fake, github_app, clock, live_server, _isolated, monkeypatch
):
    """HOOK-02: of eight queued jobs, two deliveries are dropped on the way and two answered
    503 by a stalled Zoomies; one pass asks for those four, they arrive under their own
    X-GitHub-Delivery and their jobs are recorded, each delivery once; a second pass, and
    one from a restarted controller (a new client, nothing in memory), ask for nothing."""
    secret = "redelivery-secret"
    _isolated.set(webhook_secrets=secret)
    fake.webhook_url, fake.webhook_secret = f"{live_server.url}/webhooks/github", secret
    install(fake, "acme", ("app",))
    real_record = webhooks.record
    stalled = []

    def record(deliveries):
        if stalled:
            raise OperationalError("database is locked")
        return real_record(deliveries)

    monkeypatch.setattr(webhooks, "record", record)
    jobs: dict[str, list[int]] = {"ok": [], "dropped": [], "503": []}
    for kind in ("ok", "dropped", "503", "ok", "dropped", "503", "ok", "ok"):
        fake.set_delivery(drop=kind == "dropped")
        stalled[:] = [True] if kind == "503" else []
        jobs[kind].append(fake.queue_job("acme/app", LABELS))
        fake.wait_deliveries(sum(len(v) for v in jobs.values()))
        clock.advance(5)
    fake.set_delivery()
    stalled.clear()
    assert set(Job.objects.values_list("github_id", flat=True)) == set(jobs["ok"])
    statuses = Counter((h["status"], h["status_code"]) for h in fake.hook_deliveries)
    assert statuses == {
        ("OK", 200): 4,
        ("timed out", 0): 2,
        ("Invalid HTTP Response: 503", 503): 2,
    }
    failed = {d["id"] for d in fake.deliveries if d["job_id"] not in jobs["ok"]}

    clock.advance(60)
    report = run_pass(github_app, clock)

    assert set(report.asked) == failed and report.refused == {} and report.deferred == []
    redelivered = fake.wait_deliveries(12)[8:]
    assert {d["id"] for d in redelivered} == failed
    assert all(d["redelivery"] and d["status_code"] == 200 for d in redelivered)
    everything = jobs["ok"] + jobs["dropped"] + jobs["503"]
    assert set(Job.objects.values_list("github_id", flat=True)) == set(everything)
    assert Job.objects.filter(github_id__in=jobs["dropped"] + jobs["503"], status="queued").count()
    assert WebhookDelivery.objects.filter(delivery_id__in=failed).count() == 4
    asked_rows = RedeliveryRequest.objects.filter(outcome="asked")
    assert set(asked_rows.values_list("guid", flat=True)) == failed
    audited = AuditLog.objects.filter(action="github.redelivery_asked", actor="system:redelivery")
    assert {row.detail["guid"] for row in audited} == failed
    assert len(asks(fake)) == 4

    clock.advance(300)
    again = run_pass(github_app, clock)
    assert again.asked == [] and again.refused == {} and again.listed >= 12
    with GitHubApp(fake.app_id, fake.private_key_pem, fake.url, clock=clock) as restarted:
        clock.advance(300)
        assert run_pass(restarted, clock).asked == []
    assert len(asks(fake)) == 4
    assert WebhookDelivery.objects.count() == 8


@pytest.mark.django_db
def test_a_backlog_is_asked_for_over_passes_each_guid_once_and_each_pass_bounded(
    fake, github_app, clock
):
    """120 deliveries nobody answered (and whose redeliveries nobody answers either): each
    pass makes at most its page bound of list calls and MAX_ASKS asks, oldest first; the
    backlog is asked for over three passes, every guid exactly once, and a fourth asks none."""
    install(fake, "acme", ("app",))
    for _ in range(120):
        fake.queue_job("acme/app", LABELS)
    originals = {d["id"] for d in fake.deliveries}
    per_pass = []
    for _ in range(4):
        before = len(fake.calls)
        report = run_pass(github_app, clock)
        calls = fake.calls[before:]
        lists = [p for m, p, _ in calls if m == "GET" and p == "/app/hook/deliveries"]
        assert len(lists) <= redelivery.MAX_PAGES
        assert len(calls) - len(lists) == len(report.asked) <= MAX_ASKS
        per_pass.append((len(report.asked), len(report.deferred)))
        clock.advance(300)
    assert per_pass == [(50, 70), (50, 20), (20, 0), (0, 0)]
    asked_ids = Counter(path.split("/")[-2] for path in asks(fake))
    assert set(asked_ids.values()) == {1}
    asked_guids = set(RedeliveryRequest.objects.values_list("guid", flat=True))
    assert asked_guids == originals
    first_asked = int(min(asked_ids))
    assert first_asked == fake.hook_deliveries[0]["id"]  # oldest first


@pytest.mark.django_db
def test_poll06_a_rate_limited_pass_holds_until_githubs_time_and_calls_nothing_meanwhile(
    fake, github_app, clock
):
    """POLL-06: GitHub's reset on the App's own calls holds the pass until then (audited);
    a pass meanwhile makes no call; after it, the failed deliveries are asked for."""
    install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    fake.rate_limit_app(reset_in=600)
    held = run_pass(github_app, clock)
    assert held.asked == [] and held.held_until is not None
    assert abs((held.held_until - clock.now()).total_seconds() - 600) <= 1
    audit = AuditLog.objects.get(action="github.redelivery_held")
    assert "rate limited by GitHub" in audit.detail["reason"]
    calls = len(fake.calls)
    clock.advance(300)
    assert run_pass(github_app, clock).held_until == held.held_until
    assert len(fake.calls) == calls
    clock.advance(301)
    report = run_pass(github_app, clock)
    assert len(report.asked) == 1
    assert RedeliveryState.objects.get().held_until is None


@pytest.mark.django_db
def test_the_pass_keeps_to_the_sweep_budget_of_the_apps_hour(fake, github_app, clock):
    """With most of the App's hour spent, the pass lists (one call, to learn the quota) and
    asks nothing; what it would have asked is read again by the next pass."""
    install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    fake.spend_app_quota(4000)  # of 5,000; github.sweep_budget keeps the pass to a quarter
    report = run_pass(github_app, clock)
    assert report.over_budget and "github.sweep_budget" in report.over_budget
    assert asks(fake) == [] and not RedeliveryRequest.objects.exists()
    (hook,) = fake.hook_deliveries
    seen_until = RedeliveryState.objects.get().seen_until
    assert seen_until == datetime.fromisoformat(hook["delivered_at"])


@pytest.mark.django_db
def test_a_delivery_github_will_not_redeliver_is_recorded_refused_and_not_asked_again(
    fake, github_app, clock
):
    """GitHub's 422 (here: the delivery left its window between the listing and the ask)
    is recorded as refused, audited, and not asked for again."""
    install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    real = github_app.redeliver_hook_delivery

    def too_late(delivery_id):
        clock.advance(3 * 86400 + 1)
        try:
            return real(delivery_id)
        finally:
            clock.advance(-(3 * 86400 + 1))

    github_app.redeliver_hook_delivery = too_late
    report = run_pass(github_app, clock)
    assert report.asked == [] and len(report.refused) == 1
    assert RedeliveryRequest.objects.get().outcome == "refused"
    assert AuditLog.objects.filter(action="github.redelivery_refused").count() == 1
    github_app.redeliver_hook_delivery = real
    clock.advance(300)
    assert run_pass(github_app, clock).asked == []
    assert len(asks(fake)) == 1


@pytest.mark.django_db
def test_off_means_no_call_and_no_app_means_nothing_to_do(fake, github_app, clock, _isolated):
    install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    _isolated.set(redelivery_interval="0s")
    assert not run_pass(github_app, clock).enabled
    assert fake.calls == []
    _isolated.set(redelivery_interval=None)
    assert not redelivery_step(clock.now()).configured  # no App in the settings


def test_the_interval_is_off_at_0s_and_at_least_a_minute_otherwise():
    entry = registry.ENTRIES["github.redelivery_interval"]
    assert entry.default == timedelta(minutes=5)
    assert entry.problem(timedelta(0)) is None
    assert entry.problem(timedelta(minutes=1)) is None
    assert "under a minute" in entry.problem(timedelta(seconds=30))


@pytest.mark.django_db
def test_the_ticker_runs_a_pass_at_start_then_every_interval_and_none_when_off(
    monkeypatch, _isolated
):
    enqueued = []
    monkeypatch.setattr(ticker, "enqueue", lambda func, *args: enqueued.append(func))
    start = datetime(2026, 9, 5, 12, 0, tzinfo=UTC)
    t = ticker.default_ticker(start)
    task = "runners.tasks.redelivery_task"
    t.step(start)
    assert enqueued.count(task) == 1  # the pass at start: what failed while it was down
    t.step(start + timedelta(minutes=4))
    assert enqueued.count(task) == 1
    t.step(start + timedelta(minutes=5))
    assert enqueued.count(task) == 2
    _isolated.set(redelivery_interval="0s")
    t.step(start + timedelta(minutes=20))
    assert enqueued.count(task) == 2


@pytest.mark.django_db
def test_one_pass_at_a_time(monkeypatch):
    ran = []
    monkeypatch.setattr("runners.tasks.redelivery_step", lambda now: ran.append(now) or "done")
    assert leases.acquire(
        "redelivery", holder="another", now=datetime.now(UTC), ttl=timedelta(minutes=1)
    )
    assert redelivery_task() == "another redelivery pass is running" and ran == []
    leases.release("redelivery", holder="another", force=True)
    assert redelivery_task() == "done" and len(ran) == 1


@pytest.mark.django_db(transaction=True)
def test_issue29_item4_a_delivery_zoomies_refused_as_malformed_is_not_asked_for_again(
    fake, github_app, clock, live_server, _isolated
):
    """Issue 29 item 4: the controller asked GitHub to redeliver a delivery it had itself
    answered 400, which the same bytes get again. A 503 of the same pass still is asked."""
    _isolated.set(webhook_secrets="s3")
    fake.webhook_url, fake.webhook_secret = f"{live_server.url}/webhooks/github", "s3"
    install(fake, "acme", ("app",))
    broken = {"action": "queued", "installation": {"id": 1}, "workflow_job": {"id": "x"}}
    refused = fake.send_event("workflow_job", broken)
    fake.wait_deliveries(1)
    fake.webhook_url = f"{live_server.url}/nowhere"  # answered 404: worth asking again
    lost = fake.send_event("ping", {"zen": "Keep it logically awesome."})
    codes = {d["id"]: d["status_code"] for d in fake.wait_deliveries(2)}
    assert codes == {refused: 400, lost: 404}
    fake.webhook_url = f"{live_server.url}/webhooks/github"
    clock.advance(60)
    report = run_pass(github_app, clock)
    assert report.asked == [lost]
    assert len(asks(fake)) == 1
