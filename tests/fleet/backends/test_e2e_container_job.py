"""A job end to end on a container backend: the controller (the test's live server), the fake
GitHub, and an agent whose runners are containers on a real Docker or Podman engine.

The job is queued at the fake GitHub; the controller's reconcile pass (driven here, as the
remote-agent e2e does) mints a JIT configuration and queues a create for the host; the agent
starts a fresh container from the locally built runner image with that configuration in its
environment; the fake runner in it takes the job and exits; the agent reports it, the row
is reaped and the container deleted. The container joins the host's network, so the runner
reaches the fake GitHub on 127.0.0.1.
"""

from __future__ import annotations

import threading

import docker.errors
import pytest
from django.utils import timezone

from fleet.actions import create_join_token
from fleet.agent.agent import Agent
from fleet.agent.backends.base import WorkloadStatus
from fleet.agent.backends.container import CPUS_LABEL, HOST_LABEL, POOL_LABEL, container_name
from fleet.models import Host
from runners import reconcile
from runners.github.fake import FakeGitHub
from runners.housekeeping import housekeeping_step
from runners.models import Runner
from tests.e2e.harness import wait_for
from tests.e2e.live_github import fake_github_for
from tests.fleet.backends.conftest import Engine
from zoomies_site.core import registry

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
LABELS = ["self-hosted", "containers"]


@pytest.fixture
def github(live_server, tmp_path, monkeypatch, engine: Engine):
    with fake_github_for(
        live_server.url,
        tmp_path,
        monkeypatch,
        secret="container-secret",
        name="zoomies-containers",
        labels=["containers"],
        backend=engine.kind,
        image=engine.image,
    ) as fake:
        yield fake


@pytest.fixture
def container_agent(live_server, tmp_path, engine: Engine):
    _row, join_token = create_join_token(now=timezone.now(), actor="test")
    backend = engine.backend(host="zoomies-containers-1", network_mode="host", slots=2)
    agent = Agent(
        live_server.url,
        tmp_path / "state",
        tmp_path / "work",
        [backend],
        name="zoomies-containers-1",
        capacity=2,
        join_token=join_token,
    )
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    yield agent, backend
    agent.request_stop()
    thread.join(timeout=40)


def drive_until(predicate, timeout: float, what: str):
    """The controller's ticker, in miniature: reconcile passes until `predicate()` holds."""

    def step():
        reconcile.reconcile_now()
        return predicate()

    return wait_for(step, timeout, what, every=0.3)


def test_back01_a_job_runs_in_a_fresh_container_that_is_removed_after(
    github: FakeGitHub, container_agent, engine: Engine
):
    """BACK-01, BACK-02, BACK-04, SCHED-15: the pool's backend is the engine; its runner is
    a container with the JIT configuration in its environment and the host's slot share as
    its limits; the job completes and the container is gone afterwards."""
    agent, backend = container_agent
    host = wait_for(
        lambda: Host.objects.filter(name="zoomies-containers-1").first(), 30, "the agent to join"
    )
    assert engine.kind in host.backends and host.cpus and host.memory_mb

    job = github.queue_job(repo="acme/app", labels=LABELS, duration=0.3)
    seen: dict[int, dict] = {}

    def container_seen() -> bool:
        for workload in backend.list():
            if workload.runner_id not in seen:
                client = engine.client()
                try:
                    seen[workload.runner_id] = client.api.inspect_container(
                        container_name(workload.runner_id)
                    )
                except docker.errors.NotFound:
                    pass  # removed since the listing: its job is done; the next one is seen
                finally:
                    client.close()
        return bool(seen)

    drive_until(
        lambda: container_seen() and github.job(job)["status"] == "completed",
        90,
        "the job to run in a container",
    )
    assert github.job(job)["conclusion"] == "success"
    (runner_id,) = seen
    attrs = seen[runner_id]
    labels = attrs["Config"]["Labels"]
    assert labels[POOL_LABEL] == "zoomies-containers" and labels[HOST_LABEL] == host.name
    assert any(e.startswith("ACTIONS_RUNNER_INPUT_JITCONFIG=") for e in attrs["Config"]["Env"])
    # The controller sent the runner's share of the host, and the engine applied it.
    assert labels[CPUS_LABEL] and attrs["HostConfig"]["Memory"] > 0
    # The agent reports the runner removed with the end of its output, which the row keeps
    # for the failed retention (LOG-06); housekeeping then reaps the row (RUN-19), and the
    # agent deletes the container once the controller accepted the end (AGENT-18).
    drive_until(
        lambda: Runner.objects.get(pk=runner_id).state == "removed", 60, "the runner removed"
    )
    assert f"job {job} finished: success" in Runner.objects.get(pk=runner_id).output_tail
    retained = timezone.now() - registry.get("scheduler.failed_retention")
    Runner.objects.filter(pk=runner_id).update(finished_at=retained)  # the retention is over

    def reaped() -> bool:
        # Not at the first step necessarily: the row is kept while anything still owes it
        # work (an open task, an exit not yet linked to its job's end: RUN-19), which under
        # load can outlast the removed report (CI on PostgreSQL once found it kept at once).
        housekeeping_step(timezone.now())
        return not Runner.objects.filter(pk=runner_id).exists()

    drive_until(reaped, 30, "the removed runner's row reaped")
    wait_for(
        lambda: backend.inspect(runner_id).status == WorkloadStatus.MISSING,
        60,
        "the finished container to be deleted",
    )
    assert backend.list() == []
