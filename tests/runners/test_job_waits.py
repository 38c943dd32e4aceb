"""Why a queued job has no runner is kept, shown and, past a threshold, raised (issue 8 item 2).

Before, a job whose labels matched no pool, or whose pool had no host that could run it,
waited with no sign anywhere: the plan had a reason, but nothing kept it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import User
from accounts.tokens import create_api_token
from fleet.models import Host
from runners import reconcile
from runners.models import Job, Pool
from runners.problems import waiting_jobs
from runners.scheduler import HostView, JobView, PoolView, RunnerView, Snapshot, decide
from runners.waits import job_wait_reasons, record_wait_reasons
from tests.runners.test_reconcile import fake_gh, fleet_rows  # noqa: F401  (fixtures)

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def pool(id: int, name: str, labels: tuple[str, ...], **kw) -> PoolView:
    fields = dict(backend="process", platform="linux/x64", host_selector=(), image="",
                  cpus=None, memory_mb=None)  # fmt: skip
    fields.update(kw)
    return PoolView(id=id, name=name, labels=labels, **fields)


def job(id: int, *labels: str) -> JobView:
    return JobView(id=id, labels=labels, repository="acme/app", installation_id=None,
                   created_at=T0)  # fmt: skip


HOST = HostView(id=1, name="zoomies-h1", healthy=True, cordoned=False, backends=("process",),
                platform="linux/x64", labels=(), capacity=4, cpus=None, memory_mb=None)  # fmt: skip


def test_each_queued_job_gets_the_reason_the_plan_gives_for_it():
    snapshot = Snapshot(
        now=T0,
        pools=(
            pool(1, "zoomies-cpu", ("cpu",)),
            pool(2, "zoomies-gpu", ("gpu",), host_selector=(("gpu", "a100"),)),
            pool(3, "zoomies-paused", ("frozen",), paused=True),
        ),
        hosts=(HOST,),
        runners=(),
        queued_jobs=(
            job(10, "self-hosted", "nothing-has-this"),
            job(11, "self-hosted", "gpu"),
            job(12, "frozen"),
            job(13, "cpu"),
        ),
    )
    plan = decide(snapshot)
    reasons = job_wait_reasons(snapshot, plan, ["zoomies-cpu: could not mint: 500"])
    assert reasons[10].startswith("no pool matches runs-on [self-hosted, nothing-has-this]")
    assert "zoomies-gpu" in reasons[11] and "gpu=a100" in reasons[11]
    assert "paused" in reasons[12]
    assert "could not mint" in reasons[13]


@pytest.fixture
def api(db):
    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _row, secret = create_api_token(user=user, name="r", scopes=["fleet:read"], actor="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.mark.django_db(transaction=True)
def test_the_pass_keeps_each_reason_where_the_api_the_admin_and_the_problems_show_it(
    fake_gh,  # noqa: F811
    fleet_rows,  # noqa: F811
    api,
    client,
    admin,
):
    installation, _pool, host = fleet_rows
    # The only host carries no gpu label, so the gpu pool has nowhere to run.
    Pool.objects.create(name="zoomies-gpu", labels=["gpu"], backend="process",
                        platform="linux/x64", host_selector={"gpu": "a100"})  # fmt: skip
    for github_id, labels in [(1, ["self-hosted", "arm-only"]), (2, ["self-hosted", "gpu"])]:
        Job.objects.create(
            github_id=github_id, repository="acme/app", labels=labels, status="queued",
            installation=installation, created_at=T0, updated_at=T0,
        )  # fmt: skip
    reconcile.reconcile_now(now_fn=lambda: T0)
    unmatched, no_host = Job.objects.get(github_id=1), Job.objects.get(github_id=2)
    assert unmatched.wait_reason.startswith("no pool matches runs-on [self-hosted, arm-only]")
    assert "zoomies-gpu" in no_host.wait_reason and "gpu=a100" in no_host.wait_reason
    assert unmatched.wait_reason_at == T0

    listed = {j["github_id"]: j for j in api.get("/api/v1/jobs?status=queued").json()["results"]}
    assert listed[1]["wait_reason"] == unmatched.wait_reason
    assert listed[2]["wait_reason"] == no_host.wait_reason

    client.force_login(admin)
    page = client.get("/admin/runners/job/").content.decode()
    assert "no pool matches runs-on" in page

    # Within the threshold nothing is raised; past it, both jobs are named with their reasons.
    assert waiting_jobs(T0 + timedelta(minutes=9)) == []
    (problem,) = waiting_jobs(T0 + timedelta(minutes=11))
    assert problem["key"] == "jobs.waiting_too_long"
    assert "2 job(s)" in problem["title"]
    assert "acme/app job 1" in problem["detail"] and "arm-only" in problem["detail"]
    assert "acme/app job 2" in problem["detail"] and "gpu=a100" in problem["detail"]

    # Once the job starts, its old reason is no longer shown as news.
    Job.objects.filter(github_id=1).update(status="in_progress")
    listed = {j["github_id"]: j for j in api.get("/api/v1/jobs").json()["results"]}
    assert listed[1]["wait_reason"] == "" and listed[1]["wait_reason_at"] is None
    assert Host.objects.filter(pk=host.pk).exists()


def test_the_problems_api_names_a_job_that_waited_past_the_threshold(api):
    now = timezone.now()
    Job.objects.create(
        github_id=7, repository="acme/app", labels=["self-hosted", "nope"], status="queued",
        created_at=now - timedelta(minutes=30), updated_at=now,
        wait_reason="no pool matches runs-on [self-hosted, nope]",
    )  # fmt: skip
    problems = api.get("/api/v1/problems").json()["results"]
    waiting = [p for p in problems if p["key"] == "jobs.waiting_too_long"]
    assert waiting and "no pool matches runs-on [self-hosted, nope]" in waiting[0]["detail"]


def test_issue21_item6_a_capped_pool_in_backoff_says_so_with_numbers_that_agree():
    """Issue 21 item 6: seven jobs for a pool capped at 4 with no live runner, in its start
    backoff after three failed starts. The reason used to open "3 more runners wanted ...
    held back by its cap of 4 (it has 0 live)"; now the backoff, which holds every start,
    comes first, and the cap's numbers add up: 7 wanted, room for 4, 3 beyond it."""
    capped = pool(1, "zoomies-cpu", ("cpu",), max_runners=4)
    failed = tuple(
        RunnerView(
            id=i,
            pool_id=1,
            host_id=1,
            state="failed",
            created_at=T0,
            state_changed_at=T0,
            finished_at=T0,
        )  # fmt: skip
        for i in (1, 2, 3)
    )
    snapshot = Snapshot(
        now=T0 + timedelta(seconds=5),
        pools=(capped,),
        hosts=(HOST,),
        runners=failed,
        queued_jobs=tuple(job(10 + i, "self-hosted", "cpu") for i in range(7)),
    )
    plan = decide(snapshot)
    assert plan.creates == ()
    reason = job_wait_reasons(snapshot, plan)[10]
    backoff, cap = reason.split("; ")
    assert backoff.startswith("zoomies-cpu waits ") and "3 failed starts" in backoff
    assert cap == (
        "7 runners wanted in zoomies-cpu, its cap of 4 leaves room for 4 (0 live), "
        "so 3 wait for a runner to end"
    )


@pytest.mark.django_db
def test_a_pass_writes_only_the_reasons_that_changed_since_its_snapshot(
    django_assert_max_num_queries,
):
    """Issue 28: every pass read every queued job twice (the snapshot, then each reason
    against the table); the snapshot's stored reasons leave out the unchanged ones, so a
    pass over thousands of waiting jobs whose reasons stand writes and reads nothing more.
    A job that left the queue after the snapshot keeps its row as it is."""
    rows = {
        github_id: Job.objects.create(
            github_id=github_id,
            repository="acme/app",
            labels=["x"],
            status="queued",
            wait_reason="no pool matches",
            wait_reason_at=T0,
            created_at=T0,
            updated_at=T0,
        )
        for github_id in (1, 2, 3)
    }
    stored: dict[int, str] = {}
    snapshot = reconcile.build_snapshot(T0, wait_reasons=stored)
    assert stored == {row.pk: "no pool matches" for row in rows.values()}
    assert [j.id for j in snapshot.queued_jobs] == [row.pk for row in rows.values()]

    unchanged = {row.pk: "no pool matches" for row in rows.values()}
    with django_assert_max_num_queries(0):
        assert record_wait_reasons(unchanged, T0 + timedelta(seconds=1), stored=stored) == 0

    Job.objects.filter(pk=rows[3].pk).update(status="in_progress")
    later = T0 + timedelta(seconds=2)
    changed = unchanged | {rows[2].pk: "pool zoomies-cpu is full", rows[3].pk: "moved on"}
    assert record_wait_reasons(changed, later, stored=stored) == 1
    after = {j.github_id: (j.wait_reason, j.wait_reason_at) for j in Job.objects.all()}
    assert after == {
        1: ("no pool matches", T0),
        2: ("pool zoomies-cpu is full", later),
        3: ("no pool matches", T0),
    }
