"""runners.webhooks.record writes a burst's in_progress and completed deliveries together
(issue 28, the burst of 500): the common case (a known job moving forward on its runner)
in about two statements a delivery instead of twenty, and exactly what the one-by-one path
writes: the jobs, their runners' moves, the stop tasks, the audit rows and the events.
Anything else still goes one by one, and a group that finds a row moved since it was read
goes one by one whole."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import AuditLog
from fleet.models import AgentTask
from fleet.states import TaskKind
from fleet.taskqueue import enqueue_task, take_tasks
from runners import webhooks
from runners.actions import jobs as job_actions
from runners.models import Job, Runner, WebhookDelivery
from tests.runners.conftest import WEBHOOK_SECRET, acme_installation, make_host, make_runner
from tests.runners.test_webhooks import job_payload
from zoomies_site.core.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _setup(db, github_settings):
    acme_installation()
    github_settings.set(webhook_secrets=WEBHOOK_SECRET)


def checked(job_id: int, action: str, runner: str | None = None, *, tag: str = ""):
    payload = job_payload(action, job_id=job_id, runner_name=runner)
    if runner is None and action != "queued":
        payload["workflow_job"]["runner_name"] = None  # as GitHub sends a cancelled job's
    body = json.dumps(payload, sort_keys=True).encode()
    result = webhooks.check(
        body=body, event="workflow_job", delivery_id=f"d-{action}-{job_id}{tag}",
        signature=webhooks.sign(body, WEBHOOK_SECRET), secrets=[WEBHOOK_SECRET],
        now=timezone.now(),
    )  # fmt: skip
    assert isinstance(result, webhooks.Delivery), result
    return result


def one_at_a_time(*deliveries) -> None:
    for delivery in deliveries:
        webhooks.record([delivery])


def a_busy_fleets_burst() -> list[webhooks.Delivery]:
    """The runners and jobs before the burst, then the burst: the common cases among every
    case that must go one by one."""
    host = make_host()
    installation = acme_installation()

    def runner(name, state, **kw):
        return make_runner(name=name, state=state, host=host, installation=installation, **kw)

    runner("r1", "registering")
    runner("r2", "idle")
    for name in ("r3", "r4", "r5", "r6", "r9"):
        runner(name, "idle", ephemeral=name != "r6")
    runner("r8", "idle")
    runner("r10", "idle")
    runner("r14", "idle", ephemeral=False)
    for name in ("r16", "r17", "r18"):
        created = runner(name, "provisioning")
        enqueue_task(host_id=host.pk, runner_id=created.pk, kind=TaskKind.CREATE_RUNNER,
                     payload={}, now=timezone.now())  # fmt: skip
        if name != "r18":  # r18's create is still waiting to be taken
            assert take_tasks(host, timezone.now(), 10)
    queued = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18)
    one_at_a_time(*(checked(j, "queued") for j in queued))
    # r17 and r18 took their jobs before their create results landed.
    one_at_a_time(*(checked(j, "in_progress", f"r{j}") for j in (3, 4, 5, 6, 9, 14, 17, 18)))
    Runner.objects.filter(name="r14").update(state="idle")  # its report said so since
    one_at_a_time(checked(9, "completed", "r9"))
    Runner.objects.filter(name="r4").update(
        drain_deferred_until=timezone.now() + timedelta(minutes=5)
    )
    enqueue_task(host_id=host.pk, runner_id=Runner.objects.get(name="r5").pk,
                 kind=TaskKind.STOP_RUNNER, payload={}, now=timezone.now())  # fmt: skip
    redelivered = checked(13, "in_progress", "r13")
    one_at_a_time(redelivered)
    return [
        checked(1, "in_progress", "r1"),  # registering -> busy: together
        checked(2, "in_progress", "r2"),  # idle -> busy: together
        checked(3, "completed", "r3"),  # busy -> draining, a stop task: together
        checked(4, "completed", "r4"),  # its deferred drain cleared too: together
        checked(5, "completed", "r5"),  # an open task: one by one
        checked(6, "completed", "r6"),  # not ephemeral, back to idle: one by one
        checked(7, "in_progress", "nobody"),  # no such runner: one by one
        checked(8, "completed", "r8"),  # its in_progress was lost: one by one
        checked(9, "in_progress", "r9", tag="-late"),  # stale (completed already): one by one
        checked(10, "in_progress", "r10"),  # two jobs name r10: both one by one
        checked(12, "in_progress", "r10"),
        redelivered,  # a redelivery: a duplicate
        # Cancelled while running, its delivery names no runner, but its row names r14,
        # which the next delivery names: both one by one, in this order (r14 ends busy).
        checked(14, "completed"),
        checked(15, "in_progress", "r14"),
        checked(16, "in_progress", "r16"),  # still provisioning: linked only, together
        checked(17, "completed", "r17"),  # provisioning, its create taken: drained, together
        checked(18, "completed", "r18"),  # its create not yet taken, cancelled: one by one
    ]


def state() -> dict:
    """Everything the deliveries wrote, by names and GitHub ids rather than primary keys."""
    runner_names = {str(r.pk): r.name for r in Runner.objects.all()}
    job_ids = {str(j.pk): j.github_id for j in Job.objects.all()}
    tasks = {
        str(t.pk): f"{runner_names[str(t.runner_id)]}:{t.kind}" for t in AgentTask.objects.all()
    }
    targets = {"runner": runner_names, "job": job_ids, "agenttask": tasks}

    def named(detail: dict) -> str:
        if isinstance(detail.get("runner"), int):
            detail = {**detail, "runner": runner_names[str(detail["runner"])]}
        return json.dumps(detail, sort_keys=True)

    return {
        "jobs": {
            j.github_id: (
                j.status,
                j.runner.name if j.runner else None,
                j.runner_name,
                j.conclusion,
                j.installation_id is not None,
                j.completed_at is None,
            )
            for j in Job.objects.select_related("runner")
        },  # fmt: skip
        "runners": {
            r.name: (
                r.state,
                r.online_at is None,
                r.finished_at is None,
                r.drain_deferred_until is None,
            )
            for r in Runner.objects.all()
        },  # fmt: skip
        "tasks": Counter(
            (
                runner_names[str(t.runner_id)],
                t.kind,
                t.state,
                json.dumps(t.payload, sort_keys=True).replace(
                    f'"runner_id": {t.runner_id}', "runner"
                ),
            )
            for t in AgentTask.objects.all()
        ),  # fmt: skip
        "audits": Counter(
            (
                a.actor,
                a.action,
                targets.get(a.target_type, {}).get(a.target_id, a.target_id),
                named(a.detail),
            )
            for a in AuditLog.objects.all()
        ),  # fmt: skip
        "events": Counter(
            (e.kind, targets[e.resource].get(e.resource_id) if e.resource in targets else "")
            for e in Event.objects.all()
        ),
        # Per job and per runner, the events' order is what a dashboard replays.
        "event_order": {
            name: [
                e.kind
                for e in Event.objects.filter(resource="runner", resource_id=pk).order_by("pk")
            ]
            for pk, name in runner_names.items()
        },  # fmt: skip
        "deliveries": sorted(
            (d.delivery_id, d.event, d.action, d.repository, d.installation_id is not None)
            for d in WebhookDelivery.objects.all()
        ),
    }


def wipe() -> None:
    for model in (AgentTask, Job, Runner, WebhookDelivery, AuditLog, Event):
        model.objects.all().delete()


def answers(burst) -> list:
    return [(a.status, a.body) if isinstance(a, webhooks.Outcome) else repr(a) for a in burst]


def test_hook05_hook06_a_bursts_moves_are_written_together_as_one_by_one_would(monkeypatch):
    together_ids: list[int] = []
    real = job_actions.apply_job_moves_together

    def watched(moves, **kwargs):
        together_ids.extend(m.update.github_id for m in moves)
        return real(moves, **kwargs)

    monkeypatch.setattr(webhooks, "apply_job_moves_together", watched)
    burst = a_busy_fleets_burst()  # its fleet's own single deliveries go together too
    together_ids.clear()
    together = answers(webhooks.record(burst))
    first = state()
    assert sorted(together_ids) == [1, 2, 3, 4, 16, 17]

    wipe()
    together_ids.clear()
    monkeypatch.setattr(webhooks, "BULK_FROM", 10**6)  # the one-by-one path alone
    alone = answers(webhooks.record(a_busy_fleets_burst()))
    second = state()
    assert together_ids == []

    assert together == alone
    assert first == second
    # And what that is (HOOK-05, HOOK-06, RUN-11): busy, linked; draining with a stop task
    # after the drain grace; the rest as the one-by-one path leaves them.
    assert first["jobs"][1][:2] == ("in_progress", "r1")
    assert first["runners"]["r1"][:2] == ("busy", False)
    assert first["runners"]["r3"][0] == first["runners"]["r4"][0] == "draining"
    assert first["runners"]["r4"][3] is True  # its deferred drain cleared
    assert first["runners"]["r6"][0] == "idle"
    assert first["jobs"][9][0] == "completed"
    assert first["runners"]["r14"][0] == "busy" and first["jobs"][15][1] == "r14"
    assert first["runners"]["r16"][0] == "provisioning" and first["jobs"][16][1] == "r16"
    assert first["runners"]["r17"][0] == first["runners"]["r18"][0] == "draining"
    r17_stop = [t for t in first["tasks"] if t[0] == "r17" and t[1] == TaskKind.STOP_RUNNER]
    assert len(r17_stop) == 1 and '"grace": 0' in r17_stop[0][3]  # it was not busy
    assert ("r18", TaskKind.CREATE_RUNNER, "cancelled") in {t[:3] for t in first["tasks"]}
    stops = [t for t in first["tasks"] if t[1] == TaskKind.STOP_RUNNER and t[0] in ("r3", "r4")]
    assert len(stops) == 2 and all('"grace": 0' not in t[3] for t in stops)
    assert answers(webhooks.record([checked(1, "in_progress", "r1")]))[0][1]["duplicate"]


def test_hook02_a_burst_of_moves_costs_about_two_statements_a_delivery(
    django_assert_max_num_queries,
):
    host = make_host()
    installation = acme_installation()
    for i in range(40):
        make_runner(name=f"m{i}", state="idle", host=host, installation=installation)
    webhooks.record([checked(100 + i, "queued") for i in range(40)])
    with django_assert_max_num_queries(2 * 40 + 25):  # one by one: about 750
        started = webhooks.record([checked(100 + i, "in_progress", f"m{i}") for i in range(40)])
    with django_assert_max_num_queries(2 * 40 + 25):  # one by one: about 900
        ended = webhooks.record([checked(100 + i, "completed", f"m{i}") for i in range(40)])
    assert [a.status for a in started + ended] == [200] * 80
    assert Counter(Runner.objects.values_list("state", flat=True)) == {"draining": 40}
    assert Job.objects.filter(status="completed", runner__isnull=False).count() == 40
    assert AgentTask.objects.filter(kind=TaskKind.STOP_RUNNER).count() == 40


def test_a_runner_moved_since_the_group_read_it_sends_the_group_one_by_one(monkeypatch):
    """Between the group's read and its write the runner was drained by another writer (on
    PostgreSQL the lock prevents it; the guard is there all the same): the group's savepoint
    takes every row back, and each delivery goes one by one, where that runner stays as the
    other writer left it and the rest are recorded, none twice."""
    host = make_host()
    installation = acme_installation()
    for i in range(3):
        make_runner(name=f"x{i}", state="idle", host=host, installation=installation)
    webhooks.record([checked(200 + i, "queued") for i in range(3)])
    real = job_actions.choose_job_moves

    def drained_meanwhile(updates):
        chosen = real(updates)
        Runner.objects.filter(name="x1").update(state="draining")  # "the other writer"
        return chosen

    monkeypatch.setattr(webhooks, "choose_job_moves", drained_meanwhile)
    result = webhooks.record([checked(200 + i, "in_progress", f"x{i}") for i in range(3)])
    assert [a.status for a in result] == [200, 200, 200]
    assert dict(Runner.objects.values_list("name", "state")) == {
        "x0": "busy",
        "x1": "draining",
        "x2": "busy",
    }
    assert Job.objects.filter(github_id__range=(200, 202), status="in_progress").count() == 3
    assert WebhookDelivery.objects.filter(action="in_progress").count() == 3
    assert AuditLog.objects.filter(action="runner.busy").count() == 2


def test_a_single_jobs_moves_go_together_in_fewer_statements_to_the_same_rows(monkeypatch):
    """A single job's `in_progress` and `completed` arrive one at a time: the grouped path
    takes them too (BULK_FROM 1), in fewer statements, leaving what one by one leaves."""
    host, installation = make_host(), acme_installation()
    results = []
    for bulk_from in (1, 10**6):
        wipe()
        monkeypatch.setattr(webhooks, "BULK_FROM", bulk_from)
        make_runner(name="r1", state="idle", host=host, installation=installation)
        webhooks.record([checked(1, "queued")])
        counts = []
        for action in ("in_progress", "completed"):
            with CaptureQueriesContext(connection) as queries:
                webhooks.record([checked(1, action, "r1")])
            counts.append(len(queries.captured_queries))
        results.append((counts, state()))
    (together, first), (alone, second) = results
    assert first == second
    assert first["runners"]["r1"][0] == "draining"
    assert together[0] < alone[0] and together[1] < alone[1], (together, alone)
