"""Runner reports: registering, then phases, then the end (RUN-15); a running phase makes a
registering runner idle and never busy (RUN-16); a host speaks only for its own runners
(RUN-18); an ended runner's report is accepted so the agent may clean up (AGENT-18).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import connection, connections

from fleet.models import AgentTask
from runners.actions import JobUpdate, apply_agent_reports, apply_job_update
from runners.actions import reports as reports_module
from runners.models import Job, Runner
from tests.fleet.conftest import T0, join, later, make_runner
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("registry_defaults")


def report(agent_api, token: str, *reports: dict) -> dict:
    answer = agent_api.post("reports", {"reports": list(reports)}, token=token)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.django_db(transaction=True)
def test_run15_16_registering_running_removed_moves_provisioning_registering_idle_removed(
    agent_api,
):
    """RUN-15, RUN-16: the agent's reports walk the row; a running phase never makes it busy."""
    host, token = join("h1")
    runner = make_runner(host, "provisioning")
    seen = []

    def state() -> str:
        runner.refresh_from_db()
        return runner.state

    body = report(agent_api, token, {"runner_id": runner.pk, "state": "registering"})
    assert body == {"accepted": [runner.pk], "refused": []}
    seen.append(state())
    report(agent_api, token, {"runner_id": runner.pk, "state": None, "phase": "running"})
    seen.append(state())
    assert runner.phase == "running"
    # Reported again, the running phase changes nothing: only GitHub makes a runner busy.
    report(agent_api, token, {"runner_id": runner.pk, "phase": "running"})
    seen.append(state())
    report(
        agent_api,
        token,
        {"runner_id": runner.pk, "state": "removed", "phase": "exited", "exit_code": 0},
    )
    seen.append(state())
    assert seen == ["registering", "idle", "idle", "removed"]
    assert (runner.phase, runner.exit_code) == ("exited", 0)
    assert runner.finished_at is not None


@pytest.mark.django_db
def test_run16_a_running_phase_never_moves_an_idle_or_busy_runner():
    host, _ = join("h1")
    busy = make_runner(host, "busy")
    idle = make_runner(host, "idle")
    provisioning = make_runner(host, "provisioning")
    for runner in (busy, idle, provisioning):
        apply_agent_reports(
            host=host, reports=[{"runner_id": runner.pk, "phase": "running"}], now=later(5)
        )
        before = runner.state
        runner.refresh_from_db()
        assert runner.state == before


@pytest.mark.django_db
def test_run15_a_failed_end_stores_the_message_and_exit_code():
    host, _ = join("h1")
    runner = make_runner(host, "idle")
    AgentTask.objects.create(
        host=host, runner=runner, kind="stop_runner", lease_seconds=600, created_at=T0
    )
    accepted, refused = apply_agent_reports(
        host=host,
        reports=[
            {
                "runner_id": runner.pk,
                "state": "failed",
                "phase": "exited",
                "exit_code": 3,
                "message": "Runner.Listener exited with code 3",
            }
        ],
        now=later(9),
    )
    assert (accepted, refused) == ([runner.pk], [])
    runner.refresh_from_db()
    assert (runner.state, runner.exit_code) == ("failed", 3)
    assert runner.message == "Runner.Listener exited with code 3"
    # Nothing is left to stop.
    assert AgentTask.objects.get(runner=runner).state == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_run18_a_report_about_another_hosts_runner_is_refused(agent_api):
    host, token = join("h1")
    other, _ = join("h2")
    mine = make_runner(host, "provisioning")
    theirs = make_runner(other, "provisioning")
    nobodys = make_runner(None, "provisioning")
    body = report(
        agent_api,
        token,
        {"runner_id": mine.pk, "state": "registering"},
        {"runner_id": theirs.pk, "state": "removed", "exit_code": 0},
        {"runner_id": nobodys.pk, "state": "registering"},
        {"runner_id": 987654, "state": "registering"},
    )
    assert body == {"accepted": [mine.pk], "refused": [theirs.pk, nobodys.pk, 987654]}
    assert Runner.objects.get(pk=theirs.pk).state == "provisioning"
    assert Runner.objects.get(pk=nobodys.pk).state == "provisioning"


@pytest.mark.django_db(transaction=True)
def test_agent18_an_ended_runners_report_is_accepted_and_changes_nothing(agent_api):
    host, token = join("h1")
    runner = make_runner(host, "failed")
    Runner.objects.filter(pk=runner.pk).update(message="host h1 lost: no heartbeat for 5m")
    body = report(agent_api, token, {"runner_id": runner.pk, "state": "removed", "exit_code": 0})
    assert body == {"accepted": [runner.pk], "refused": []}
    runner.refresh_from_db()
    assert runner.state == "failed"
    assert runner.message == "host h1 lost: no heartbeat for 5m"


@pytest.mark.django_db(transaction=True)
def test_a_malformed_report_body_is_400_and_an_unknown_state_refused(agent_api):
    host, token = join("h1")
    runner = make_runner(host)
    for body in ({"reports": "no"}, {"reports": [{"runner_id": "5"}]}, {"reports": [7]}):
        assert agent_api.post("reports", body, token=token).status_code == 400
    body = report(agent_api, token, {"runner_id": runner.pk, "state": "busy"})
    assert body == {"accepted": [], "refused": [runner.pk]}
    assert agent_api.post("reports", {"reports": []}, token="zat_x").status_code == 401


# -- an in_progress that arrived while the runner was still provisioning -----------------


def apply_in_progress(runner: Runner, github_id: int = 41) -> Job | None:
    """GitHub's in_progress for a job on `runner`, as a webhook applies it."""
    return apply_job_update(
        JobUpdate(
            github_id=github_id,
            status="in_progress",
            repository="acme/app",
            runner_name=runner.name,
        ),
        installation=None,
        now=later(3),
        source="webhook",
        actor="system:webhook",
    )


def job_started_early(runner: Runner, github_id: int = 41):
    """GitHub's in_progress for `runner`, delivered while it is still provisioning: busy is
    not reachable from provisioning, so the move is dropped and only the job row keeps it."""
    job = apply_in_progress(runner, github_id)
    runner.refresh_from_db()
    assert runner.state == "provisioning"
    return job


@pytest.mark.django_db
def test_run16_hook05_an_early_in_progress_makes_the_runner_busy_once_it_is_registering():
    """RUN-16, HOOK-05: the in_progress that arrived during provisioning is not lost: the
    registering report lets it land, and the job is linked to the runner."""
    host, _ = join("h1")
    runner = make_runner(host, "provisioning")
    job = job_started_early(runner)

    apply_agent_reports(
        host=host, reports=[{"runner_id": runner.pk, "state": "registering"}], now=later(5)
    )
    runner.refresh_from_db()
    job.refresh_from_db()
    assert runner.state == "busy"
    assert job.runner_id == runner.pk


@pytest.mark.django_db
def test_run16_an_in_progress_during_provisioning_is_an_expected_race_not_a_warning(caplog):
    """A burst's runners often take their job before their create result lands: the move
    is left to the registering report, and nothing is logged as an illegal transition (a
    warning a job, hundreds in a burst of 500)."""
    host, _ = join("h1")
    runner = make_runner(host, "provisioning")
    caplog.set_level(logging.INFO, logger="zoomies.runners")
    job = job_started_early(runner)
    assert job.runner_id == runner.pk
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("while it is provisioning" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db
def test_run16_an_early_in_progress_is_not_undone_by_the_running_phase():
    """RUN-16: registering and running in one report end busy, never idle, for a runner whose
    job GitHub already said had started."""
    host, _ = join("h1")
    runner = make_runner(host, "provisioning")
    job_started_early(runner)

    apply_agent_reports(
        host=host,
        reports=[{"runner_id": runner.pk, "state": "registering", "phase": "running"}],
        now=later(5),
    )
    runner.refresh_from_db()
    assert runner.state == "busy"
    # The running phase reported again changes nothing.
    apply_agent_reports(
        host=host, reports=[{"runner_id": runner.pk, "phase": "running"}], now=later(7)
    )
    runner.refresh_from_db()
    assert runner.state == "busy"


@pytest.mark.django_db
def test_run16_without_a_started_job_a_running_runner_is_idle():
    """RUN-16: only a GitHub signal makes a runner busy; a completed job is no such signal."""

    host, _ = join("h1")
    runner = make_runner(host, "provisioning")
    Job.objects.create(
        github_id=42,
        repository="acme/app",
        status="completed",
        runner_name=runner.name,
        created_at=T0,
        updated_at=T0,
    )
    apply_agent_reports(
        host=host,
        reports=[{"runner_id": runner.pk, "state": "registering", "phase": "running"}],
        now=later(5),
    )
    runner.refresh_from_db()
    assert runner.state == "idle"


@pytest.mark.django_db(transaction=True)
def test_run16_hook05_an_in_progress_racing_the_registering_report_still_ends_busy(monkeypatch):
    """RUN-16, HOOK-05, issue 28's CI failure (PostgreSQL): the in_progress is applied while
    an agent's report holds the runner, moved to registering, its catch-up already done and
    finding no started job. The webhook waits for the report's commit and then sees
    registering (busy); before, it read provisioning beside the report, dropped busy as too
    early, and the runner of a running job stayed registering."""
    host, _ = join("h1")
    runner = make_runner(host, "provisioning")
    holding, release = threading.Event(), threading.Event()
    catch_up = reports_module._catch_up_started_job

    def held_catch_up(runner, **kwargs):
        catch_up(runner, **kwargs)
        holding.set()  # the report's transaction stays open until the webhook has begun
        assert release.wait(30)

    monkeypatch.setattr(reports_module, "_catch_up_started_job", held_catch_up)
    failures: list[BaseException] = []

    def in_thread(work):
        def run():
            try:
                work()
            except BaseException as exc:  # the test reports it
                failures.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    report = in_thread(
        lambda: apply_agent_reports(
            host=host, reports=[{"runner_id": runner.pk, "state": "registering"}], now=later(5)
        )
    )
    assert holding.wait(30)
    webhook = in_thread(lambda: apply_in_progress(runner))
    if connection.vendor == "postgresql":
        # The webhook's transaction waits for the runner's row lock, not past it.
        wait_until(lambda: waiting_on_a_lock() == 1, 30, "the webhook to wait for the runner")
    else:
        time.sleep(0.5)  # SQLite: its writer waits for the report's write lock meanwhile
    release.set()
    report.join(30)
    webhook.join(30)
    assert not failures, failures
    runner.refresh_from_db()
    assert runner.state == "busy"
    assert Job.objects.get(github_id=41).runner_id == runner.pk


def waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_run15_a_pass_of_many_reports_is_a_few_transactions_answered_in_the_order_sent(
    agent_api, monkeypatch
):
    """Issue 28: a burst's agent reports hundreds of runners a pass; they are applied up to
    REPORTS_PER_TRANSACTION to a transaction (each its own was that many waits for SQLite's
    write lock), runner by runner in ascending id with each runner's reports in the order
    sent, and answered in the order sent."""
    monkeypatch.setattr(reports_module, "REPORTS_PER_TRANSACTION", 4)
    host, token = join("h1")
    other, _ = join("h2")
    runners = [make_runner(host, "provisioning") for _ in range(6)]
    theirs = make_runner(other, "provisioning")
    sent = []
    for runner in reversed(runners):  # the agent's order, not the ids'
        sent.append({"runner_id": runner.pk, "state": "registering"})
        sent.append({"runner_id": runner.pk, "state": None, "phase": "running"})
    sent.insert(3, {"runner_id": theirs.pk, "state": "registering"})
    transactions = []
    real = reports_module.transaction.atomic

    def counted(*args, **kwargs):
        if kwargs.get("durable"):
            transactions.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(reports_module.transaction, "atomic", counted)
    body = report(agent_api, token, *sent)
    assert body["refused"] == [theirs.pk]
    assert body["accepted"] == [r["runner_id"] for r in sent if r["runner_id"] != theirs.pk]
    assert len(transactions) == 4  # 13 reports, 4 to a transaction
    # Each runner's registering landed before its running phase: registering, then idle.
    assert {Runner.objects.get(pk=r.pk).state for r in runners} == {"idle"}
    assert Runner.objects.get(pk=theirs.pk).state == "provisioning"


def _trail(runner: Runner) -> dict:
    """What a runner's reports left: its row, its audit rows and its events."""
    from accounts.models import AuditLog  # noqa: PLC0415
    from zoomies_site.core.models import Event  # noqa: PLC0415

    runner.refresh_from_db()
    audits = AuditLog.objects.filter(target_type="runner", target_id=str(runner.pk)).order_by("pk")
    events = Event.objects.filter(resource="runner", resource_id=str(runner.pk)).order_by("pk")
    return {
        "row": (runner.state, runner.phase),
        "audit": [(a.actor, a.action, a.detail) for a in audits],
        "events": [e.kind for e in events],
    }


@pytest.mark.django_db
def test_run15_16_a_bursts_registering_reports_applied_together_leave_what_one_at_a_time_does(
    django_assert_max_num_queries,
):
    """Issue 28: the reports a burst's agent sends (each new runner `registering`, its
    workload running or not yet) are applied as a group, with one INSERT for their audit
    rows and events: each runner ends exactly as the same report alone leaves one (state,
    phase, audit rows, events; RUN-16's early in_progress caught up to busy), and the
    group's statements do not grow by a transaction's worth a runner. A report that is not
    of that kind in the same call (a second report for a runner, an idle runner's phase,
    another host's runner) goes the one-at-a-time way."""
    host, _ = join("h1")
    other, _ = join("h2")
    alone = [make_runner(host, "provisioning") for _ in range(4)]
    together = [make_runner(host, "provisioning") for _ in range(24)]
    # The early pair's reports carry the running phase: its event follows the move to busy.
    early_alone, early_together = alone[1], together[1]
    job_started_early(early_alone, github_id=51)
    job_started_early(early_together, github_id=52)

    def sent(runner: Runner, index: int) -> dict:
        phase = "running" if index % 2 else None
        return {"runner_id": runner.pk, "state": "registering", "phase": phase}

    for index, runner in enumerate(alone):
        apply_agent_reports(host=host, reports=[sent(runner, index)], now=later(5))
    with django_assert_max_num_queries(60):  # one at a time: about 17 statements a runner
        accepted, refused = apply_agent_reports(
            host=host, reports=[sent(r, i) for i, r in enumerate(together)], now=later(5)
        )
    assert (accepted, refused) == ([r.pk for r in together], [])
    for index, runner in enumerate(alone):
        # The early pair's jobs are 51 and 52; all else is the same.
        assert str(_trail(runner)) == str(_trail(together[index])).replace("job 52", "job 51")
    assert _trail(early_together)["row"][0] == "busy"
    assert Job.objects.get(github_id=52).runner_id == early_together.pk
    assert _trail(early_together)["events"][-2:] == ["runner.busy", "runner.reported"]
    others = [r for r in together if r is not early_together]
    assert {_trail(r)["row"] for r in others} == {("registering", ""), ("idle", "running")}

    # Mixed: a runner reported twice, an idle runner's phase, another host's runner, and two
    # plain ones; each as alone.
    twice, plain_a, plain_b = (make_runner(host, "provisioning") for _ in range(3))
    idle = make_runner(host, "idle")
    theirs = make_runner(other, "provisioning")
    accepted, refused = apply_agent_reports(
        host=host,
        reports=[
            {"runner_id": twice.pk, "state": "registering"},
            {"runner_id": plain_a.pk, "state": "registering", "phase": "running"},
            {"runner_id": twice.pk, "state": None, "phase": "running"},
            {"runner_id": idle.pk, "phase": "running"},
            {"runner_id": theirs.pk, "state": "registering"},
            {"runner_id": plain_b.pk, "state": "registering", "phase": "running"},
        ],
        now=later(9),
    )
    assert refused == [theirs.pk]
    assert _trail(twice)["row"] == _trail(plain_a)["row"] == ("idle", "running")
    assert [a[1] for a in _trail(twice)["audit"]] == ["runner.registering", "runner.idle"]
    assert _trail(idle)["row"] == ("idle", "running")
    assert _trail(theirs)["row"][0] == "provisioning"
