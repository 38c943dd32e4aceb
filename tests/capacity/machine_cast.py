"""Rented machines for the operators' tests (issue 23 item 7), made the way the product makes
them: a provider configured through fleet.provider_actions, a pool through the pool actions,
queued jobs recorded as GitHub's deliveries are, and the machine loop's own rounds against
the fake provider, with the claim code its agent would join with.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from capacity import machines
from fleet import provider_actions
from fleet.actions import join_host
from fleet.machines import plan_machine
from fleet.models import Machine, MachineProvider
from fleet.states import MachineState as M
from runners.actions import JobUpdate, record_job
from runners.actions import pools as pool_actions
from runners.models import Pool

# In the past, so an age worked out against the real clock (the API's) is positive.
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
POOL = "zoomies-linux-x64"
FACTS = {"backends": ["docker"], "platform": "linux/x64", "capacity": 2}
_jobs = count(700_000)


@pytest.fixture
def machine_loop(registry_defaults, monkeypatch, settings):
    """The loop's providers fresh for the test, and the controller URL its machines get."""
    monkeypatch.setattr(machines, "_providers", {})
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    (settings.DATA_DIR / "internal-port").write_text("18999\n")
    return registry_defaults


def configure(name: str = "fake", **values) -> MachineProvider:
    values = {"kind": "fake", "pools": [POOL], **values, "name": name}
    return provider_actions.create_provider(values, actor="test", now=T0)


def the_fake(row: MachineProvider):
    return machines.provider_for(row)


def queue_demand(jobs: int = 1, pool: str = POOL) -> None:
    """Queued jobs for `pool` (made once, labelled with its own name), so the loop has demand
    no host can take. Any pool but POOL runs on podman, which the rented hosts (docker) do
    not offer: a machine rented for one pool never absorbs another's demand."""
    if not Pool.objects.filter(name=pool).exists():
        backend = "docker" if pool == POOL else "podman"
        pool_actions.create_pool(
            {"name": pool, "labels": [pool], "platform": "linux/x64", "backend": backend},
            actor="test",
            now=T0,
        )
    for _ in range(jobs):
        record_job(
            JobUpdate(github_id=next(_jobs), status="queued", repository="octo/app",
                      labels=("self-hosted", pool), created_at=T0),
            installation=None, now=T0, source="webhook", actor="test",
        )  # fmt: skip


def rent(row: MachineProvider, until: str) -> Machine:
    """One machine rented from `row` by the loop, taken as far as `until` (planned with the
    provider down, bootstrapping, enrolling, ready, or quarantined), for its first pool."""
    fake = the_fake(row)
    queue_demand(pool=row.pools[0])
    fake.down = until == M.PLANNED
    machines.step(T0)
    machine = Machine.objects.get(provider=row.name)
    if until in (M.ENROLLING, M.READY, M.QUARANTINED):
        machines.step(T0 + timedelta(seconds=5))
    if until in (M.READY, M.QUARANTINED):
        boot = fake.bootstrap_of(machine.name)
        join_host(join_token=None, claim_code=boot["claim_code"], name=machine.name,
                  facts=FACTS, now=T0 + timedelta(seconds=6))  # fmt: skip
        machines.step(T0 + timedelta(seconds=10))
    if until == M.QUARANTINED:
        # Somebody else's machine now answers to its name: nothing can prove it ours.
        fake.add_foreign(machine.name)
        machines.step(T0 + timedelta(seconds=15))
    machine.refresh_from_db()
    assert machine.state == until, (machine.state, machine.message)
    return machine


def planned(provider: str = "fake", *, at: datetime = T0) -> Machine:
    """A machine the planner asked for and nothing has touched since."""
    return plan_machine(provider=provider, pool_id=None, now=at, reason="a queued job")
