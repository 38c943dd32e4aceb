"""The reconcile pass over real rows and a real (fake) GitHub over loopback."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from fleet.models import AgentTask, Host
from runners import reconcile
from runners.github import config as github_config
from runners.github.fake import FakeGitHub
from runners.models import Installation, Job, Pool, Runner
from zoomies_site import leases, registry

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
        image=reconcile.FAKE_RUNNER_IMAGE,
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
        assert env["ACTIONS_RUNNER_INPUT_JITCONFIG"]
        assert task.payload["command"][-1] == "runners.github.fake.runner"
    registered = {r["name"] for r in fake_gh.runners(installation.github_id)}
    assert registered == {r.name for r in runners}


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
    main_connection = connection
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
