"""A remote agent in its own process: it joins, runs jobs, and is given up on when killed.

The controller here is the test's own live server (real HTTP on loopback), so the test can
drive the housekeeping tick with a moved clock; the agent is `manage.py agent` in a child
process, exactly as an operator starts one on another host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.actions import create_join_token
from fleet.models import Host
from runners import reconcile
from runners.github import config as github_config
from runners.github.fake import FakeGitHub
from runners.housekeeping import housekeeping_step
from runners.models import Installation, Job, Pool, Runner
from tests.e2e.harness import MANAGE, ROOT, kill_leftovers, wait_for
from zoomies_site import registry

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
LABELS = ["self-hosted", "remote"]


@pytest.fixture
def github(live_server, tmp_path, monkeypatch):
    fake = FakeGitHub(
        webhook_url=f"{live_server.url}/webhooks/github", webhook_secret="remote-secret"
    ).start()
    key = tmp_path / "app.pem"
    key.write_text(fake.private_key_pem)
    monkeypatch.setenv("ZOOMIES_GITHUB_API_URL", fake.url)
    monkeypatch.setenv("ZOOMIES_GITHUB_APP_ID", str(fake.app_id))
    monkeypatch.setenv("ZOOMIES_GITHUB_PRIVATE_KEY_FILE", str(key))
    monkeypatch.setenv("ZOOMIES_GITHUB_WEBHOOK_SECRETS", "remote-secret")
    registry.reload()
    github_config.clear_cache()
    inst = fake.add_installation(
        account="acme", account_type="Organization", repositories=["acme/app"]
    )
    installation = Installation.objects.create(
        github_id=inst, account="acme", kind="org", repositories=["acme/app"]
    )
    Pool.objects.create(
        name="zoomies-remote", installation=installation, labels=["remote"], backend="process",
        image=reconcile.FAKE_RUNNER_IMAGE, max_runners=2,
    )  # fmt: skip
    yield fake
    fake.stop()
    registry.reload()
    github_config.clear_cache()


@pytest.fixture
def remote_agent(live_server, tmp_path):
    _row, join_token = create_join_token(now=timezone.now(), actor="test")
    state_dir = tmp_path / "remote-agent"
    env = {
        **os.environ,
        "ZOOMIES_JOIN_TOKEN": join_token,
        "ZOOMIES_DATA_DIR": str(tmp_path / "agent-data"),
        "PYTHONUNBUFFERED": "1",
    }
    log = (tmp_path / "agent.log").open("w")
    process = subprocess.Popen(
        [sys.executable, MANAGE, "agent", "--controller", live_server.url, "--state-dir",
         str(state_dir), "--name", "zoomies-remote-1", "--capacity", "2"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)
    kill_leftovers(str(state_dir))


def drive_until(predicate, timeout: float, what: str):
    """The controller's ticker, in miniature: reconcile passes until `predicate()` holds."""

    def step():
        reconcile.reconcile_now()
        return predicate()

    return wait_for(step, timeout, what, every=0.3)


def test_arch08_host04_a_remote_agent_runs_jobs_then_is_lost_when_killed(github, remote_agent):
    """ARCH-01, ARCH-07, ARCH-08, AUTH-08, HOST-03, HOST-04, RUN-16: join with a join token,
    run a job, then SIGKILL: unhealthy after the heartbeat timeout, lost after 5 min with its
    runners failed and the running job marked, judged on a moved clock."""
    host = wait_for(
        lambda: Host.objects.filter(name="zoomies-remote-1").first(), 30, "the agent to join"
    )
    assert host.capacity == 2 and "process" in host.backends

    first = github.queue_job(repo="acme/app", labels=LABELS, duration=0.3)
    drive_until(lambda: github.job(first)["status"] == "completed", 60, "the first job to run")

    long_job = github.queue_job(repo="acme/app", labels=LABELS, duration=600)
    busy = drive_until(
        lambda: Runner.objects.filter(state="busy", host=host).first(), 60, "a busy runner"
    )
    assert Job.objects.get(github_id=long_job).runner_id == busy.pk

    remote_agent.send_signal(signal.SIGKILL)
    remote_agent.wait(timeout=10)
    last_beat = Host.objects.get(pk=host.pk).last_heartbeat_at

    housekeeping_step(last_beat + timedelta(seconds=89))
    assert Host.objects.get(pk=host.pk).health == "healthy"

    housekeeping_step(last_beat + timedelta(seconds=91))
    assert Host.objects.get(pk=host.pk).health == "unhealthy"
    busy.refresh_from_db()
    assert busy.state == "busy", "an unhealthy host's runners are not failed yet"
    # Nothing new is placed on an unhealthy host.
    github.queue_job(repo="acme/app", labels=LABELS, duration=1)
    wait_for(lambda: Job.objects.filter(status="queued").exists(), 10, "the new job")
    reports = reconcile.reconcile_now()
    assert not any(r.created for r in reports)
    assert not Runner.objects.filter(host=host, state="provisioning").exists()

    housekeeping_step(last_beat + timedelta(minutes=5, seconds=1))
    assert Host.objects.get(pk=host.pk).health == "lost"
    busy.refresh_from_db()
    assert busy.state == "failed"
    assert "lost" in busy.message
    assert Job.objects.get(github_id=long_job).fleet_failure
