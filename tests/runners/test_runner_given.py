"""What a runner was given and who gave it (BACK-09), and the host reserve held back from
the scheduler's books (BACK-07)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleet.agent.backends.base import RunnerSpec
from fleet.agent.backends.container import CPUS_FROM_LABEL, MEMORY_FROM_LABEL, ContainerBackend
from fleet.agent.backends.resources import allocation
from fleet.models import AgentTask, Host
from runners import actions
from runners.actions.lifecycle import NewRunner
from runners.models import Installation, Pool, Runner
from runners.reconcile import build_snapshot

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def create(pool: Pool, host: Host, *, cpus: float | None, memory_mb: int | None) -> Runner:
    installation, _ = Installation.objects.get_or_create(github_id=1, account="acme")
    new = NewRunner(
        name=f"{pool.name}-{Runner.objects.count() + 1}", pool=pool, host_id=host.pk,
        installation=installation, image="busybox", cpus=cpus, memory_mb=memory_mb,
        github_runner_id=None, env={}, command=None, reason="test",
    )  # fmt: skip
    return actions.create_runner(new, now=T0, actor="test")


def test_back09_who_gave_each_figure_is_written_on_the_row_and_sent_to_the_agent():
    """BACK-09: a figure the pool typed is the pool's, a slot share the host's, and no
    figure is nobody's; the create task carries the same words, and the container's
    labels say them (a figure the task gave is never relabelled by the agent)."""
    host = Host.objects.create(name="h1", capacity=4, cpus=8.0, memory_mb=16000)
    typed = Pool.objects.create(name="typed", backend="docker", cpus=2.0, memory_mb=None)
    runner = create(typed, host, cpus=2.0, memory_mb=3700)
    runner.refresh_from_db()
    assert (runner.cpus, runner.cpus_from) == (2.0, "pool")
    assert (runner.memory_mb, runner.memory_from) == (3700, "host")
    payload = AgentTask.objects.get(runner=runner, kind="create_runner").payload
    assert (payload["cpus_from"], payload["memory_from"]) == ("pool", "host")

    spec = RunnerSpec.from_payload(payload)
    backend = ContainerBackend(host="h1")
    given = allocation(spec.cpus, spec.memory_mb, None)
    labels = backend.labels_for(spec, given)
    assert (labels[CPUS_FROM_LABEL], labels[MEMORY_FROM_LABEL]) == ("pool", "host")

    bare = Pool.objects.create(name="bare", backend="docker")
    nothing = create(bare, host, cpus=None, memory_mb=None)
    nothing.refresh_from_db()
    assert (nothing.cpus_from, nothing.memory_from) == ("", "")
    # A figure written at create is never recomputed: the pool's later edit leaves it.
    Pool.objects.filter(pk=typed.pk).update(cpus=None)
    runner.refresh_from_db()
    assert runner.cpus_from == "pool"


def test_back07_the_schedulers_snapshot_holds_the_host_reserve_back():
    """BACK-07: the scheduler is handed the allocatable machine, the machine less a reserve
    of at least half a core or a twentieth of it, so slot shares never add up to all of
    it; a figure a host has not reported stays unknown."""
    Host.objects.create(name="small", capacity=4, cpus=4.0, memory_mb=8000)
    Host.objects.create(name="big", capacity=8, cpus=64.0, memory_mb=256000)
    Host.objects.create(name="unsized", capacity=2, cpus=None, memory_mb=None)
    hosts = {h.name: h for h in build_snapshot(T0).hosts}
    assert (hosts["small"].cpus, hosts["small"].memory_mb) == (3.5, 8000)
    assert (hosts["big"].cpus, hosts["big"].memory_mb) == (60.8, 256000)
    assert (hosts["unsized"].cpus, hosts["unsized"].memory_mb) == (None, None)
