"""A remote agent killed with a create task in flight, and started again under the same
identity: its inventory settles the task in seconds, not at the end of its 20-minute lease,
and the job runs on one runner (issue 11 item 3).

The controller is the test's live server; the agent is a real process (`python -m
fleet.agent`), first as tests/e2e/stalling_agent.py, whose create hangs at a chosen point so
that the kill -9 lands with the task in flight.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import AuditLog
from fleet.actions import create_join_token
from fleet.models import AgentTask, Host
from runners.github.programs import FAKE_RUNNER
from runners.housekeeping import housekeeping_step
from runners.models import Job, Runner
from tests.e2e.harness import ROOT, kill_leftovers, wait_for
from tests.e2e.live_github import fake_github_for
from tests.e2e.test_first_job import jit_mints
from tests.e2e.test_remote_agent import agent_environment, drive_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
LABELS = ["self-hosted", "restart"]
NAME = "zoomies-restart-1"


@pytest.fixture
def github(live_server, tmp_path, monkeypatch):
    with fake_github_for(
        live_server.url,
        tmp_path,
        monkeypatch,
        secret="restart-secret",
        name="zoomies-restart",
        labels=["restart"],
        backend="process",
        image=FAKE_RUNNER,
    ) as fake:
        yield fake


class AgentProcess:
    """One host's agent over one state dir, started and killed as a process."""

    def __init__(self, url: str, tmp_path) -> None:
        self.url = url
        self.state_dir = tmp_path / "agent-state"
        self.log = tmp_path / "agent.log"
        self.process: subprocess.Popen | None = None

    def start(self, *extra: str, module: str = "fleet.agent", join_token: str = "") -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, "--controller", self.url, "--state-dir",
                 str(self.state_dir), "--name", NAME, "--capacity", "2", *extra],
                env=agent_environment(join_token), cwd=ROOT, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        kill_leftovers(str(self.state_dir))


@pytest.fixture
def agent(live_server, tmp_path):
    process = AgentProcess(live_server.url, tmp_path)
    yield process
    process.stop()


@pytest.mark.parametrize("stall", ["after", "before"])
def test_task02_a_restarted_agent_settles_its_in_flight_create_from_its_inventory(
    github, agent, tmp_path, stall
):
    """TASK-02, AGENT-23, AGENT-24, RUN-15: kill -9 with the create in flight, once after the
    workload started (the create is done: its workload is on the inventory) and once before
    (it is offered again at once, and the second delivery makes it). On a clock moved a
    minute on, the lease sweep leaves the task alone; the inventory settles it. One runner,
    one JIT configuration, and the job runs on it."""
    _row, join_token = create_join_token(now=timezone.now(), actor="test")
    mark = tmp_path / "stalled"
    agent.start("--stall", stall, "--mark", str(mark), module="tests.e2e.stalling_agent",
                join_token=join_token)  # fmt: skip
    host = wait_for(lambda: Host.objects.filter(name=NAME).first(), 30, "the agent to join")
    job_id = github.queue_job(repo="acme/app", labels=LABELS, duration=1, conclusion="success")
    drive_until(mark.exists, 60, "the agent to take the create and hang in it")
    task = AgentTask.objects.get(host=host, kind="create_runner")
    runner = Runner.objects.get(host=host)
    assert (task.state, task.attempt, runner.state) == ("in_flight", 1, "provisioning")
    assert int(mark.read_text()) == runner.pk

    agent.kill()
    # A minute on, the lease sweep still owes the task nineteen minutes.
    housekeeping_step(timezone.now() + timedelta(minutes=1))
    task.refresh_from_db()
    assert task.state == "in_flight"

    restarted = time.monotonic()
    agent.start()
    wait_for(lambda: AgentTask.objects.get(pk=task.pk).state != "in_flight", 30, "the settling")
    settled_in = time.monotonic() - restarted
    task.refresh_from_db()
    settlement = AuditLog.objects.filter(
        target_type="agenttask",
        target_id=str(task.pk),
        action__in=["task.settled", "task.requeued"],
    ).get()
    assert settlement.actor == f"agent:{NAME}"
    if stall == "after":
        assert (task.state, task.attempt, settlement.action) == ("done", 1, "task.settled")
    else:
        assert settlement.action == "task.requeued"
        wait_for(lambda: AgentTask.objects.get(pk=task.pk).state == "done", 30, "the second offer")
        assert AgentTask.objects.get(pk=task.pk).attempt == 2
    print(f"restart: the create in flight ({stall} its workload) settled {settled_in:.1f} s "
          "after the agent was started again")  # fmt: skip

    drive_until(lambda: github.job(job_id)["status"] == "completed", 90, "the job to run")
    assert github.job(job_id)["runner_name"] == runner.name
    assert list(Runner.objects.filter(host=host).values_list("pk", flat=True)) == [runner.pk]
    assert len(jit_mints(github)) == 1
    assert Job.objects.get(github_id=job_id).runner_name == runner.name
