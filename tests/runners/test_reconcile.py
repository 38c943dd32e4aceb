"""The reconcile pass over real rows and a real (fake) GitHub over loopback."""

from __future__ import annotations

import io
import threading
import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import OperationalError, connections
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import Failure, OrmQ, Success
from django_q.monitor import save_task

from fleet.models import AgentTask, Host
from fleet.taskqueue import wire_payload
from runners import reconcile, wake
from runners.actions import apply_agent_reports, drain_runner, lifecycle
from runners.github import config as github_config
from runners.github.fake import FakeGitHub
from runners.github.fake.runner import FakeRunner, decode_jit_config
from runners.github.programs import FAKE_RUNNER
from runners.models import Installation, Job, Pool, Runner
from runners.scheduler import DrainRunner, FailRunner, Plan
from runners.tasks import reconcile_task
from tests.runners.conftest import wakes_asked
from zoomies_site.core import leases, registry

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def fake_gh(tmp_path, monkeypatch):
    fake = FakeGitHub(webhook_url=None, webhook_secret="s").start()
    key = tmp_path / "app.pem"
    key.write_text(fake.private_key_pem)
    monkeypatch.setenv("ZOOMIES_GITHUB_API_URL", fake.url)
    monkeypatch.setenv("ZOOMIES_GITHUB_APP_ID", str(fake.app_id))
    monkeypatch.setenv("ZOOMIES_GITHUB_PRIVATE_KEY_FILE", str(key))
    registry.reload()
    github_config.clear_cache()
    yield fake
    fake.stop()
    registry.reload()
    github_config.clear_cache()


@pytest.fixture
def fleet_rows(fake_gh):
    inst_id = fake_gh.add_installation(
        account="acme", account_type="Organization", repositories=["acme/app"]
    )
    installation = Installation.objects.create(
        github_id=inst_id, account="acme", kind="org", repositories=["acme/app"]
    )
    pool = Pool.objects.create(
        name="zoomies-linux-x64",
        installation=installation,
        labels=["linux", "x64"],
        backend="process",
        platform="linux/x64",
        image=FAKE_RUNNER,
        max_runners=5,
    )
    host = Host.objects.create(
        name="zoomies-host-1", capacity=2, backends=["process"], platform="linux/x64",
        last_heartbeat_at=T0,
    )  # fmt: skip
    return installation, pool, host


def queue_jobs(installation, n, start=1):
    for i in range(start, start + n):
        Job.objects.create(
            github_id=i, repository="acme/app", labels=["self-hosted", "linux"], status="queued",
            installation=installation, created_at=T0, updated_at=T0,
        )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_sched16_a_pass_writes_runner_rows_with_their_create_tasks(fake_gh, fleet_rows):
    """SCHED-16, SCHED-03, SCHED-15: JIT minted, then row + task; the reason is readable."""
    installation, pool, host = fleet_rows
    queue_jobs(installation, 3)
    reports = reconcile.reconcile_now(now_fn=lambda: T0)
    assert reports is not None
    runners = list(Runner.objects.order_by("pk"))
    # Two slots on the only host: two runners, never three.
    assert len(runners) == 2
    for runner in runners:
        assert runner.state == "provisioning"
        assert runner.host_id == host.pk
        assert runner.name.startswith("zoomies-linux-x64-")
        assert "create" in runner.message and "zoomies-linux-x64" in runner.message
        task = AgentTask.objects.get(runner=runner)
        assert task.kind == "create_runner"
        assert task.lease_seconds == 20 * 60
        env = task.payload["env"]
        # SEC-05: the runner gets its single-use JIT config and nothing of the App.
        assert set(env) <= {"ACTIONS_RUNNER_INPUT_JITCONFIG", "PYTHONPATH"}
        # AUTH-07: the single-use credential is sealed in the row; only its agent sees it.
        assert env["ACTIONS_RUNNER_INPUT_JITCONFIG"].startswith("sealed:")
        assert task.payload["command"][-1] == "runners.github.fake.runner"
    registered = {r["name"] for r in fake_gh.runners(installation.github_id)}
    assert registered == {r.name for r in runners}


@pytest.mark.django_db(transaction=True)
def test_sched16_a_credential_whose_runner_row_cannot_be_written_is_deregistered_at_once(
    fake_gh, fleet_rows, monkeypatch
):
    """SCHED-16: the JIT configuration is minted before the row is written. When the write
    fails (another process held SQLite's write lock past the busy timeout, seen in
    tests/e2e/test_drills_webhook.py) no agent task will ever start that runner: its
    registration is deleted at GitHub at once, not left there for the reap."""
    installation, _pool, _host = fleet_rows
    queue_jobs(installation, 1)

    def locked(new, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(reconcile, "create_runner", locked)
    report = reconcile.reconcile_once(T0)
    assert Runner.objects.count() == 0
    assert [c for c in fake_gh.calls if c[1].endswith("/generate-jitconfig")]
    assert fake_gh.runners(installation.github_id) == []
    (skipped,) = report.skipped
    assert "could not write the runner row: database is locked" in skipped
    assert "its registration was deleted at GitHub" in skipped


def mints_come_back_together(monkeypatch) -> list[int]:
    """Every mint of a pass comes back before the first is written (as a burst's do while
    a write holds the lock): the sizes of the groups the pass writes are recorded."""
    real_wait, real_group = reconcile.wait, reconcile.create_runners
    groups: list[int] = []

    def all_at_once(futures, return_when):
        return real_wait(futures, return_when="ALL_COMPLETED")

    def recording(news, **kwargs):
        groups.append(len(news))
        return real_group(news, **kwargs)

    monkeypatch.setattr(reconcile, "wait", all_at_once)
    monkeypatch.setattr(reconcile, "create_runners", recording)
    return groups


@pytest.mark.django_db(transaction=True)
def test_sched16_runners_whose_credentials_come_back_together_are_written_together(
    fake_gh, fleet_rows, monkeypatch
):
    """Issue 28: one transaction for the runners a burst's mints brought back at once, each
    still its row and its create task (SCHED-16)."""
    installation, _pool, host = fleet_rows
    Host.objects.filter(pk=host.pk).update(capacity=4)
    queue_jobs(installation, 4)
    groups = mints_come_back_together(monkeypatch)
    report = reconcile.reconcile_once(T0)
    assert groups == [4] and len(report.created) == 4
    runners = list(Runner.objects.order_by("pk"))
    assert [AgentTask.objects.get(runner=r).kind for r in runners] == ["create_runner"] * 4
    assert {r["name"] for r in fake_gh.runners(installation.github_id)} == {r.name for r in runners}


@pytest.mark.django_db(transaction=True)
def test_sched16_a_bad_row_in_a_group_loses_only_itself(fake_gh, fleet_rows, monkeypatch):
    """The group's transaction fails with its bad row; the others are written each alone,
    and only the bad one's credential is withdrawn at GitHub."""
    installation, _pool, host = fleet_rows
    Host.objects.filter(pk=host.pk).update(capacity=4)
    queue_jobs(installation, 4)
    groups = mints_come_back_together(monkeypatch)
    real_write = lifecycle._write_runner
    names: list[str] = []  # in the order the pass made them
    real_new_runner = reconcile._new_runner

    def naming(*args, **kwargs):
        made = real_new_runner(*args, **kwargs)
        names.append(made.name)
        return made

    def second_is_bad(new, **kwargs):
        if new.name == names[1]:
            raise OperationalError("database is locked")
        return real_write(new, **kwargs)

    monkeypatch.setattr(reconcile, "_new_runner", naming)
    monkeypatch.setattr(lifecycle, "_write_runner", second_is_bad)
    report = reconcile.reconcile_once(T0)
    assert groups == [4]
    written = set(Runner.objects.values_list("name", flat=True))
    assert written == {names[0], names[2], names[3]}
    assert AgentTask.objects.filter(kind="create_runner").count() == 3
    (skipped,) = report.skipped
    assert "could not write the runner row: database is locked" in skipped
    assert {r["name"] for r in fake_gh.runners(installation.github_id)} == written


@pytest.mark.django_db(transaction=True)
def test_sched28_deciding_again_after_applying_plans_no_new_creates(fake_gh, fleet_rows):
    installation, _pool, _host = fleet_rows
    queue_jobs(installation, 1)
    reconcile.reconcile_now(now_fn=lambda: T0)
    assert Runner.objects.count() == 1
    reports = reconcile.reconcile_now(now_fn=lambda: T0 + timedelta(seconds=1))
    assert reports and not any(r.created for r in reports)
    assert Runner.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_store02_no_transaction_is_open_while_github_is_called(fake_gh, fleet_rows, monkeypatch):
    """STORE-02: the JIT call happens with the pass's connection outside any transaction."""
    installation, _pool, _host = fleet_rows
    queue_jobs(installation, 2)
    # The pass's own connection object, captured in its thread: the mint runs in a worker
    # thread, where `connection` would name that thread's connection instead.
    main_connection = connections["default"]
    seen = []
    original = reconcile._mint

    def watching_mint(*args, **kwargs):
        seen.append(main_connection.in_atomic_block)
        return original(*args, **kwargs)

    monkeypatch.setattr(reconcile, "_mint", watching_mint)
    reconcile.reconcile_now(now_fn=lambda: T0)
    assert seen == [False, False]
    assert Runner.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_sched27_the_leases_writes_are_one_transaction_at_each_end_of_a_round(
    fake_gh, fleet_rows, monkeypatch
):
    """Issue 28: the wake's mark and the acquire commit together, and so do the release and
    the renewal between rounds: each lease write alone was a wait for SQLite's write lock,
    about half a burst's reconcile time. A wake that arrives during a round still brings one
    more round (SCHED-27)."""
    installation, _pool, _host = fleet_rows
    queue_jobs(installation, 1)
    main_connection = connections["default"]
    seen: list[tuple[str, bool]] = []
    mark_dirty = leases.mark_dirty
    for name in ("mark_dirty", "acquire", "release", "renew"):
        real = getattr(leases, name)

        def watching(*args, _name=name, _real=real, **kwargs):
            seen.append((_name, main_connection.in_atomic_block))
            return _real(*args, **kwargs)

        monkeypatch.setattr(leases, name, watching)
    real_once = reconcile.reconcile_once
    rounds = []

    def woken_during_the_first(now):
        rounds.append(now)
        report = real_once(now)
        if len(rounds) == 1:
            mark_dirty(reconcile.LEASE_NAME)  # a wake arrives mid-round (another process)
        return report

    monkeypatch.setattr(reconcile, "reconcile_once", woken_during_the_first)
    reports = reconcile.reconcile_now(now_fn=lambda: T0)
    assert reports is not None and len(rounds) == 2
    inside = [(name, atomic) for name, atomic in seen if name != "release" or atomic]
    assert inside[:4] == [
        ("mark_dirty", True),
        ("acquire", True),
        ("release", True),
        ("renew", True),
    ]


@pytest.mark.django_db(transaction=True)
def test_sched17_a_runner_not_online_in_time_is_failed_with_a_reason(fake_gh, fleet_rows):
    installation, _pool, host = fleet_rows
    queue_jobs(installation, 1)
    reconcile.reconcile_now(now_fn=lambda: T0)
    runner = Runner.objects.get()
    later = T0 + timedelta(minutes=20, seconds=1)
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=later)
    reconcile.reconcile_now(now_fn=lambda: later)
    runner.refresh_from_db()
    assert runner.state == "failed"
    assert "provision_timeout" in runner.message
    assert runner.finished_at == later
    # Its host is told to clean up whatever it may have started.
    assert AgentTask.objects.filter(runner=runner, kind="remove_runner").exists()


@pytest.mark.django_db(transaction=True)
def test_sched27_one_pass_at_a_time_and_a_wake_meanwhile_runs_it_again(fake_gh, fleet_rows):
    """SCHED-27, STORE-07: a second caller while the lease is held marks it dirty."""
    installation, _pool, _host = fleet_rows
    rounds = []
    gate = threading.Event()
    release = threading.Event()
    original = reconcile.reconcile_once

    def slow_once(now):
        rounds.append(now)
        if len(rounds) == 1:
            gate.set()
            release.wait(10)
        return original(now)

    reconcile.reconcile_once = slow_once
    try:
        results = []
        first = threading.Thread(
            target=lambda: results.append(reconcile.reconcile_now(now_fn=lambda: T0))
        )
        first.start()
        assert gate.wait(10)
        # The first pass holds the lease: a second one is refused and leaves a mark.
        assert reconcile.reconcile_now(now_fn=lambda: T0) is None
        release.set()
        first.join(10)
    finally:
        reconcile.reconcile_once = original
    assert len(rounds) == 2, "the holder must run once more for the wake it missed"
    assert len(results[0]) == 2
    assert leases.holder_of(reconcile.LEASE_NAME)[0] == ""


@pytest.mark.django_db(transaction=True)
def test_a_pool_without_an_installation_or_app_skips_with_a_reason(fleet_rows, monkeypatch):
    installation, pool, _host = fleet_rows
    queue_jobs(installation, 1)
    monkeypatch.delenv("ZOOMIES_GITHUB_APP_ID")
    registry.reload()
    github_config.clear_cache()
    reports = reconcile.reconcile_now(now_fn=lambda: T0)
    assert Runner.objects.count() == 0
    assert any("no GitHub App" in line for line in reports[0].skipped)


def _start_fake_runner(task):
    """Run the runner a create task describes, in a thread, as the agent would."""

    # The row holds it sealed (AUTH-07); the agent receives it as the long-poll serves it.
    config = decode_jit_config(wire_payload(task)["env"]["ACTIONS_RUNNER_INPUT_JITCONFIG"])
    runner = FakeRunner(config, out=io.StringIO(), poll_wait=1)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    return runner, thread


@pytest.mark.django_db(transaction=True)
def test_sched20_a_drain_planned_from_a_stale_snapshot_never_touches_a_busy_runner(
    fake_gh, fleet_rows
):
    """SCHED-20, SCHED-21: the runner turned busy after the snapshot; the drain is dropped."""

    installation, pool, _host = fleet_rows
    Pool.objects.filter(pk=pool.pk).update(idle_timeout=timedelta(minutes=5))
    queue_jobs(installation, 1)
    reconcile.reconcile_now(now_fn=lambda: T0)
    runner = Runner.objects.get()
    Runner.objects.filter(pk=runner.pk).update(state="busy")
    plan = Plan(drains=(DrainRunner(runner.pk, "idle for 5m (idle timeout)"),))
    report = reconcile.apply_plan(plan, T0 + timedelta(minutes=6))
    runner.refresh_from_db()
    assert runner.state == "busy"
    assert not report.drained
    assert not AgentTask.objects.filter(runner=runner, kind="stop_runner").exists()


@pytest.mark.django_db(transaction=True)
def test_sched17_a_runner_that_came_online_since_the_snapshot_is_not_failed(fake_gh, fleet_rows):

    installation, _pool, _host = fleet_rows
    queue_jobs(installation, 1)
    reconcile.reconcile_now(now_fn=lambda: T0)
    runner = Runner.objects.get()
    Runner.objects.filter(pk=runner.pk).update(
        state="idle", online_at=T0
    )  # GitHub showed it online
    plan = Plan(fails=(FailRunner(runner.pk, "not online 20m after it was created"),))
    reconcile.apply_plan(plan, T0 + timedelta(minutes=21))
    runner.refresh_from_db()
    assert runner.state == "idle"


@pytest.mark.django_db(transaction=True)
def test_sched21_scale_down_deregisters_at_github_first_and_leaves_a_runner_github_calls_busy(
    fake_gh, fleet_rows
):
    """SCHED-21, SCHED-20: the idle drain asks GitHub first; a 422 "busy" wins."""
    installation, pool, _host = fleet_rows
    Pool.objects.filter(pk=pool.pk).update(idle_timeout=timedelta(minutes=5))
    queue_jobs(installation, 2)
    reconcile.reconcile_now(now_fn=lambda: T0)
    first, second = Runner.objects.order_by("pk")
    for runner in (first, second):
        Runner.objects.filter(pk=runner.pk).update(state="idle", state_changed_at=T0, online_at=T0)
    Job.objects.all().delete()  # nothing queued any more: both are surplus and idle

    # The first runner is online at GitHub and has just been handed a job there.
    fake_runner, thread = _start_fake_runner(AgentTask.objects.get(runner=first))
    try:
        job_id = fake_gh.queue_job(repo="acme/app", labels=["self-hosted"], duration=30)
        fake_gh.wait_job(job_id, "in_progress", timeout=10)
        busy_name = fake_gh.job(job_id)["runner_name"]
        assert busy_name == first.name
        later = T0 + timedelta(minutes=6)
        Host.objects.update(last_heartbeat_at=later)
        reconcile.reconcile_now(now_fn=lambda: later)
        registered = {r["name"] for r in fake_gh.runners(installation.github_id)}
    finally:
        fake_runner.stop()
        thread.join(5)
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == "idle", "GitHub said busy: the drain must not happen"
    assert second.state == "draining"
    stop = AgentTask.objects.get(runner=second, kind="stop_runner")
    assert stop.payload["grace"] == 0
    assert second.name not in registered and first.name in registered


@pytest.mark.django_db(transaction=True)
def test_run11_draining_a_busy_runner_gives_it_the_drain_grace(fleet_rows):

    _installation, pool, host = fleet_rows
    runner = Runner.objects.create(
        name="zoomies-linux-x64-1-a", pool=pool, host=host, state="busy", created_at=T0,
        state_changed_at=T0,
    )  # fmt: skip
    drain_runner(runner, now=T0, actor="user:ada", reason="operator drain")
    stop = AgentTask.objects.get(runner=runner, kind="stop_runner")
    assert stop.payload["grace"] == 300


@pytest.mark.django_db(transaction=True)
def test_a_process_pool_never_runs_an_arbitrary_image_as_a_command(fake_gh, fleet_rows):
    installation, pool, _host = fleet_rows
    Pool.objects.filter(pk=pool.pk).update(image="/bin/sh")
    queue_jobs(installation, 1)
    reports = reconcile.reconcile_now(now_fn=lambda: T0)
    assert Runner.objects.count() == 0
    assert any("process backend runs only" in line for line in reports[0].skipped)


@pytest.mark.django_db(transaction=True)
def test_sched27_a_wake_during_the_last_round_is_handed_to_a_fresh_pass(fake_gh, fleet_rows):

    before = wakes_asked()
    original = reconcile.reconcile_once

    def always_woken(now):
        leases.mark_dirty(reconcile.LEASE_NAME)
        return original(now)

    reconcile.reconcile_once = always_woken
    try:
        reports = reconcile.reconcile_now(now_fn=lambda: T0, max_rounds=3)
    finally:
        reconcile.reconcile_once = original
    assert len(reports) == 3
    assert wakes_asked() == before + 1
    assert leases.holder_of(reconcile.LEASE_NAME)[0] == ""


@pytest.mark.django_db(transaction=True)
def test_sched27_reconcile_once_command_runs_one_pass_and_says_what_it_did(fake_gh, fleet_rows):

    installation, _pool, _host = fleet_rows
    queue_jobs(installation, 1)
    out = StringIO()
    call_command("reconcile", "--once", stdout=out)
    assert "create 1 in zoomies-linux-x64: 1 job queued" in out.getvalue()
    assert Runner.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_sched27_the_django_q2_task_runs_a_pass(fake_gh, fleet_rows):

    installation, _pool, _host = fleet_rows
    queue_jobs(installation, 2)
    assert reconcile_task() == 2


@pytest.mark.django_db(transaction=True)
def test_hook04_a_burst_of_wakes_enqueues_one_pass_until_that_pass_starts():
    """HOOK-04, SCHED-27: wakes coalesce; one that lands once the pass started is kept."""

    for _ in range(20):
        wake.wake_reconcile()
    assert OrmQ.objects.count() == 1
    wake.clear_wake()  # what the task does before its pass
    wake.wake_reconcile()
    wake.wake_reconcile()
    assert OrmQ.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_woken_pass_that_succeeds_leaves_no_result_row_and_one_that_fails_does():
    """Woken passes run back to back under load: a result row each was a write taking
    SQLite's lock from the webhook writer, and the 200 kept rows were soon all passes."""
    wake.wake_reconcile()
    package = OrmQ.objects.get().task
    assert package["func"] == "runners.tasks.reconcile_task"
    finished = {"started": timezone.now(), "stopped": timezone.now(), "result": 0}
    save_task({**package, **finished, "success": True}, get_broker())
    assert not Success.objects.exists()
    save_task({**package, **finished, "success": False, "result": "boom"}, get_broker())
    assert Failure.objects.get().result == "boom"


def _deletes_of(fake: FakeGitHub, runner: Runner) -> list[tuple]:
    """The DELETEs of this runner's registration that GitHub was asked for."""
    suffix = f"/actions/runners/{runner.github_runner_id}"
    return [c for c in fake.calls if c[0] == "DELETE" and c[1].endswith(suffix)]


@pytest.mark.django_db(transaction=True)
def test_sched21_an_idle_drain_github_calls_busy_backs_off_until_the_next_reap(fake_gh, fleet_rows):
    """SCHED-21 (issue 8 item 7): GitHub answers 422 "busy" to the idle drain's DELETE, so
    the runner has a job we have not heard of. It is asked once, not on every pass: the
    drain waits for that job's end (which drains an ephemeral runner anyway) or for the
    reap interval, when it is asked again."""
    installation, pool, _host = fleet_rows
    Pool.objects.filter(pk=pool.pk).update(idle_timeout=timedelta(minutes=5))
    queue_jobs(installation, 1)
    reconcile.reconcile_now(now_fn=lambda: T0)
    runner = Runner.objects.get()
    Runner.objects.filter(pk=runner.pk).update(state="idle", state_changed_at=T0, online_at=T0)
    Job.objects.all().delete()  # the job this runner takes at GitHub is one we never heard of
    fake_runner, thread = _start_fake_runner(AgentTask.objects.get(runner=runner))
    try:
        job_id = fake_gh.queue_job(repo="acme/app", labels=["self-hosted"], duration=60)
        fake_gh.wait_job(job_id, "in_progress", timeout=10)
        first = T0 + timedelta(minutes=6)
        # A pass every 5 s for 90 s, as the ticker and the wakes would run them.
        for second in range(0, 90, 5):
            now = first + timedelta(seconds=second)
            Host.objects.update(last_heartbeat_at=now)
            reconcile.reconcile_now(now_fn=lambda now=now: now)
        assert len(_deletes_of(fake_gh, runner)) == 1
        runner.refresh_from_db()
        assert runner.state == "idle"
        assert runner.drain_deferred_until == first + registry.get("github.reap_interval")

        retry = runner.drain_deferred_until
        Host.objects.update(last_heartbeat_at=retry)
        reconcile.reconcile_now(now_fn=lambda: retry)
        assert len(_deletes_of(fake_gh, runner)) == 2  # asked again once the wait is over
    finally:
        fake_runner.stop()
        thread.join(5)


@pytest.mark.django_db(transaction=True)
def test_sched21_a_runner_drained_for_idleness_that_exits_0_stands_for_no_job(fake_gh, fleet_rows):
    """Issue 8 item 7: a runner whose registration GitHub deleted while it was idle ran no
    job after it, so its clean exit is not an unlinked exit (scheduler.unlinked_exit_grace)
    and the next queued job in its pool gets a runner on the next pass."""

    installation, pool, host = fleet_rows
    Pool.objects.filter(pk=pool.pk).update(idle_timeout=timedelta(minutes=5))
    queue_jobs(installation, 1)
    reconcile.reconcile_now(now_fn=lambda: T0)
    idle = Runner.objects.get()
    Runner.objects.filter(pk=idle.pk).update(state="idle", state_changed_at=T0, online_at=T0)
    Job.objects.all().delete()

    drained_at = T0 + timedelta(minutes=6)
    Host.objects.update(last_heartbeat_at=drained_at)
    reconcile.reconcile_now(now_fn=lambda: drained_at)
    idle.refresh_from_db()
    assert idle.state == "draining"
    assert idle.name not in {r["name"] for r in fake_gh.runners(installation.github_id)}

    exited = drained_at + timedelta(seconds=5)
    report = {"runner_id": idle.pk, "state": "removed", "phase": "exited", "exit_code": 0}
    apply_agent_reports(host=host, reports=[report], now=exited)
    idle.refresh_from_db()
    assert (idle.state, idle.exit_code) == ("removed", 0)

    queue_jobs(installation, 1, start=2)
    following = exited + timedelta(seconds=5)  # well inside the unlinked-exit grace
    Host.objects.update(last_heartbeat_at=following)
    reconcile.reconcile_now(now_fn=lambda: following)
    assert Runner.objects.exclude(pk=idle.pk).filter(state="provisioning").count() == 1


@pytest.mark.django_db(transaction=True)
def test_issue21_item5_an_installation_github_does_not_know_is_a_problem_backed_off_and_said_once(
    fake_gh, fleet_rows, caplog
):
    """Installation ids GitHub answers 404 for: the log said so twice every five seconds
    while the problems list was empty and the pool showed active. Now the failures are
    counted, minting waits a growing backoff, the log says it once, and the problems list
    names the installation, the count, since when and the pools it leaves without runners."""
    from runners.problems import runners_problems  # noqa: PLC0415

    installation, pool, _host = fleet_rows
    Installation.objects.filter(pk=installation.pk).update(github_id=987_654)  # GitHub: 404
    queue_jobs(installation, 1)
    with caplog.at_level("WARNING", logger="zoomies"):
        for seconds in range(0, 60, 5):  # a pass every five seconds for a minute
            reconcile.reconcile_now(now_fn=lambda s=seconds: T0 + timedelta(seconds=s))
    installation.refresh_from_db()
    # Backed off: 10 s, 20 s, 40 s after failures at 0, 10 and 30 s; not twelve tries.
    assert installation.mint_failures == 3, installation.mint_failures
    said = [r for r in caplog.records if "could not mint a runner credential" in r.getMessage()]
    assert len(said) == 1
    (problem,) = [p for p in runners_problems(T0 + timedelta(minutes=1))
                  if p["key"] == "github.mint_failing"]  # fmt: skip
    assert "failed to mint 3 time(s)" in problem["title"] and "987654" in problem["title"]
    assert "zoomies-linux-x64" in problem["detail"]
    assert not Runner.objects.exists()


def _pass(at):
    """A reconcile pass at `at`, its host heard from then."""
    Host.objects.update(last_heartbeat_at=at)
    return reconcile.reconcile_now(now_fn=lambda: at)


def _agent_says(host, runner, at, **report):
    apply_agent_reports(host=host, reports=[{"runner_id": runner.pk, **report}], now=at)


@pytest.mark.django_db(transaction=True)
def test_issue29_item1_sched17_a_runner_never_online_is_failed_deregistered_replaced_and_said(
    fake_gh, fleet_rows, monkeypatch
):
    """Issue 29 item 1: a runner program that stays alive without ever reaching GitHub (the
    fake holds it offline; it keeps retrying, as a real one does) was idle 0.13 s after its
    row was written, never failed, and its job waited for ever. It is idle only once GitHub
    shows it online; past scheduler.provision_timeout it is failed, its registration is
    deleted and its host told to remove it, a new runner replaces it, and the pool's
    problem says why (SCHED-17)."""
    from runners.problems import runners_problems  # noqa: PLC0415

    monkeypatch.setenv("ZOOMIES_SCHEDULER_PROVISION_TIMEOUT", "1m")
    registry.reload()
    installation, pool, host = fleet_rows
    fake_gh.hold_runners_offline()
    queue_jobs(installation, 1)
    _pass(T0)
    runner = Runner.objects.get()
    fake_runner, thread = _start_fake_runner(AgentTask.objects.get(runner=runner))
    try:
        _agent_says(host, runner, T0 + timedelta(seconds=1), state="registering")
        _agent_says(host, runner, T0 + timedelta(seconds=2), phase="running")
        for seconds in (20, 40):  # online checks: GitHub shows the registration offline
            _pass(T0 + timedelta(seconds=seconds))
        runner.refresh_from_db()
        assert runner.online_at is None
        (registration,) = fake_gh.runners(installation.github_id)
        assert registration["status"] == "offline" and thread.is_alive()

        timed_out = T0 + timedelta(minutes=1, seconds=1)
        _pass(timed_out)
        runner.refresh_from_db()
        assert runner.state == "failed"
        assert "provision_timeout" in runner.message
        assert "GitHub never showed its registration online" in runner.message
        assert AgentTask.objects.filter(runner=runner, kind="remove_runner").exists()
        assert fake_gh.runners(installation.github_id) == []  # deleted at once, not at the reap
        assert runner.deregistered_at == timed_out

        (problem,) = [p for p in runners_problems(timed_out)
                      if p["key"] == f"pool.failing_starts:{pool.name}"]  # fmt: skip
        assert "1 runner(s) failed before GitHub showed them online" in problem["title"]
        assert "GitHub never showed its registration online" in problem["detail"]

        _pass(timed_out + timedelta(seconds=15))  # after the first start backoff (10 s)
        replacement = Runner.objects.exclude(pk=runner.pk).get()
        assert replacement.state == "provisioning"
    finally:
        fake_runner.stop()
        thread.join(5)


@pytest.mark.django_db(transaction=True)
def test_issue29_item1_a_registering_runner_is_idle_once_github_shows_it_online(
    fake_gh, fleet_rows
):
    """Issue 29 item 1: GitHub's word, not the runner's process, makes a runner idle. The
    online check lists the installation's registrations at most every 15 s, and a pool
    whose runner came online has no failing-starts problem."""
    from runners.problems import runners_problems  # noqa: PLC0415

    installation, pool, host = fleet_rows
    queue_jobs(installation, 1)
    _pass(T0)
    runner = Runner.objects.get()
    _agent_says(host, runner, T0 + timedelta(seconds=1), state="registering")
    fake_gh.hold_runners_offline()
    fake_runner, thread = _start_fake_runner(AgentTask.objects.get(runner=runner))
    try:
        _pass(T0 + timedelta(seconds=2))
        runner.refresh_from_db()
        assert (runner.state, runner.online_at) == ("registering", None)
        fake_gh.hold_runners_offline(False)
        deadline = time.monotonic() + 10
        while fake_gh.runners(installation.github_id)[0]["status"] != "online":
            assert time.monotonic() < deadline, "the fake runner never came online"
            time.sleep(0.05)
        lists = [c for c in fake_gh.calls if c[0] == "GET" and c[1].endswith("/actions/runners")]
        _pass(T0 + timedelta(seconds=10))  # within 15 s of the last check: not listed again
        assert [c for c in fake_gh.calls
                if c[0] == "GET" and c[1].endswith("/actions/runners")] == lists  # fmt: skip
        _pass(T0 + timedelta(seconds=17))
        runner.refresh_from_db()
        assert (runner.state, runner.online_at) == ("idle", T0 + timedelta(seconds=17))
        assert not [p for p in runners_problems(T0 + timedelta(seconds=17))
                    if p["key"].startswith("pool.failing_starts")]  # fmt: skip
    finally:
        fake_runner.stop()
        thread.join(5)


@pytest.mark.django_db(transaction=True)
def test_issue29_item1_between_online_checks_a_pass_reads_one_row_and_writes_nothing(
    fake_gh, fleet_rows
):
    """Issue 28: a burst runs a pass every few milliseconds, and the check is due every 15 s.
    Between checks a pass neither claims the check (a write, and SQLite's write lock) nor
    loads the runners waiting for it."""
    from django.db import connection  # noqa: PLC0415
    from django.test.utils import CaptureQueriesContext  # noqa: PLC0415

    from runners.registrations import check_online  # noqa: PLC0415

    installation, _pool, host = fleet_rows
    queue_jobs(installation, 2)
    _pass(T0)
    for runner in Runner.objects.all():
        _agent_says(host, runner, T0 + timedelta(seconds=1), state="registering")
    app = github_config.get_app()
    check_online(T0 + timedelta(seconds=2), app)  # claims the check: lists once
    with CaptureQueriesContext(connection) as captured:
        assert check_online(T0 + timedelta(seconds=10), app) == []
    sql = [q["sql"] for q in captured.captured_queries]
    assert len(sql) == 1 and sql[0].lstrip().upper().startswith("SELECT"), sql
    with CaptureQueriesContext(connection) as captured:
        check_online(T0 + timedelta(seconds=18), app)  # due again: claimed and listed
    assert any(q["sql"].lstrip().upper().startswith("UPDATE") for q in captured.captured_queries)


@pytest.mark.django_db(transaction=True)
def test_issue21_item5_a_pool_whose_runners_cannot_start_is_a_problem_with_cause_count_and_since(
    fake_gh, fleet_rows
):
    """Issue 21 item 5 (and issue 29 item 4): a process pool whose runners all fail to
    start ("cannot run '/opt/actions-runner/run.sh'") stayed silent, active, with an empty
    problems list. Within a minute the list names the pool, the count, since when and the
    cause; each failed runner's registration is deleted at GitHub at once."""
    from fleet.task_results import record_task_result  # noqa: PLC0415
    from fleet.taskqueue import take_tasks  # noqa: PLC0415
    from runners.problems import runners_problems  # noqa: PLC0415

    installation, pool, host = fleet_rows
    queue_jobs(installation, 2)
    _pass(T0)
    failed_at = T0 + timedelta(seconds=5)
    why = "cannot run '/opt/actions-runner/run.sh': No such file or directory"
    for task in take_tasks(host, failed_at):
        record_task_result(host=host, task_id=task.pk, ok=False, error=why,
                           attempt=task.attempt, now=failed_at)  # fmt: skip
    assert set(Runner.objects.values_list("state", flat=True)) == {"failed"}
    _pass(failed_at + timedelta(seconds=1))
    assert fake_gh.runners(installation.github_id) == []
    (problem,) = [p for p in runners_problems(failed_at + timedelta(seconds=30))
                  if p["key"] == f"pool.failing_starts:{pool.name}"]  # fmt: skip
    assert "2 runner(s) failed before GitHub showed them online" in problem["title"]
    assert f"{failed_at:%Y-%m-%d %H:%M:%S}" in problem["title"]
    assert "Cannot run '/opt/actions-runner/run.sh'" in problem["detail"]


@pytest.mark.django_db(transaction=True)
def test_hook04_a_woken_pass_clears_its_wake_in_the_lease_transaction():
    """The task a wake enqueued clears the flag with the lease's own write (one transaction
    on the single job's path, not two): a wake from then on enqueues the next pass, and it
    is cleared even when another holder has the lease (that holder was marked to run again)."""
    wake.wake_reconcile()
    wake.wake_reconcile()
    assert OrmQ.objects.count() == 1
    assert reconcile.reconcile_now(now_fn=lambda: T0, woken=True) is not None
    wake.wake_reconcile()
    assert OrmQ.objects.count() == 2

    assert leases.acquire(reconcile.LEASE_NAME, holder="elsewhere:1:x", now=T0,
                          ttl=timedelta(minutes=5))  # fmt: skip
    assert reconcile.reconcile_now(now_fn=lambda: T0, woken=True) is None
    wake.wake_reconcile()
    assert OrmQ.objects.count() == 3
    assert not leases.release(reconcile.LEASE_NAME, holder="elsewhere:1:x")  # told to run again


@pytest.mark.django_db(transaction=True)
def test_the_mints_run_on_threads_kept_between_passes(fake_gh, fleet_rows, monkeypatch):
    """A pool of threads per pass started one on every single job's path to its mint."""
    installation, _pool, host = fleet_rows
    Host.objects.filter(pk=host.pk).update(capacity=5)
    threads: list[str] = []
    real_mint = reconcile._mint

    def noting(*args):
        threads.append(threading.current_thread().name)
        return real_mint(*args)

    def mint_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("mint")}

    monkeypatch.setattr(reconcile, "_mint", noting)
    kept = set()
    for second in range(3):
        queue_jobs(installation, 1, start=second + 1)
        reports = reconcile.reconcile_now(now_fn=lambda s=second: T0 + timedelta(seconds=s))
        assert sum(len(r.created) for r in reports) == 1
        if second == 0:
            kept = mint_threads()
    assert len(threads) == 3
    assert all(name.startswith("mint") for name in threads), threads
    assert kept and mint_threads() == kept  # the later passes started no thread
