"""The machine loop (capacity/machines.py) over rows and the fake provider: demand no host can
take rents a machine, its agent joins with the machine's claim code, it is a host, and once
idle it drains and is deleted (MACH-11..15, MACH-19)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from capacity import machines, tasks
from fleet.actions import InvalidJoinToken, join_host
from fleet.models import Host, Machine, MachineProvider
from fleet.states import MachineState as M
from runners.reconcile import LEASE_NAME as RECONCILE_LEASE
from tests.capacity.conftest import make_pool, queue_jobs
from zoomies_site.core import leases

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("registry_defaults")]

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
FACTS = {"backends": ["docker"], "platform": "linux/x64", "capacity": 2}


@pytest.fixture(autouse=True)
def _fresh_providers(registry_defaults, monkeypatch, settings):
    monkeypatch.setattr(machines, "_providers", {})
    (settings.DATA_DIR).mkdir(parents=True, exist_ok=True)
    (settings.DATA_DIR / "internal-port").write_text("18999\n")


def configure(**kw) -> MachineProvider:
    kw.setdefault("pools", ["zoomies-linux-x64"])
    return MachineProvider.objects.create(name="fake", kind="fake", created_at=T0, **kw)


def the_fake(row: MachineProvider):
    return machines.provider_for(row)


def test_mach11_mach12_demand_rents_a_machine_whose_agent_joins_and_it_becomes_a_host():
    row = configure(max_per_pool=1)
    make_pool()
    queue_jobs(2, at=T0)

    first = machines.step(T0)
    (machine,) = Machine.objects.all()
    assert "planned" in first.lines[0] and machine.pool_id is not None
    assert machine.state == M.BOOTSTRAPPING  # created in the same round, running
    assert the_fake(row).creates == 1

    machines.step(T0 + timedelta(seconds=5))
    machine.refresh_from_db()
    assert machine.state == M.ENROLLING
    assert Machine.objects.count() == 1  # covered: no second machine for the same demand

    boot = the_fake(row).bootstrap_of(machine.name)
    assert boot["controller_url"] == "http://127.0.0.1:18999" and boot["name"] == machine.name
    with pytest.raises(InvalidJoinToken):  # bound to the machine's name
        join_host(join_token=None, claim_code=boot["claim_code"], name="zm-other",
                  facts=FACTS, now=T0)  # fmt: skip
    joined_at = T0 + timedelta(seconds=6)
    host, _secret = join_host(join_token=None, claim_code=boot["claim_code"],
                              name=machine.name, facts=FACTS, now=joined_at)  # fmt: skip
    with pytest.raises(InvalidJoinToken):  # single use
        join_host(join_token=None, claim_code=boot["claim_code"], name=machine.name,
                  facts=FACTS, now=T0)  # fmt: skip

    machines.step(T0 + timedelta(seconds=10))
    machine.refresh_from_db()
    assert (machine.state, machine.host_id) == (M.READY, host.pk)


def ready_machine(row) -> Machine:
    make_pool()
    queue_jobs(1, at=T0)
    machines.step(T0)
    machines.step(T0 + timedelta(seconds=5))
    machine = Machine.objects.get()
    boot = the_fake(row).bootstrap_of(machine.name)
    join_host(join_token=None, claim_code=boot["claim_code"], name=machine.name, facts=FACTS,
              now=T0 + timedelta(seconds=6))  # fmt: skip
    from runners.models import Job  # noqa: PLC0415

    Job.objects.all().delete()  # the job went elsewhere: no demand left
    machines.step(T0 + timedelta(seconds=10))
    machine.refresh_from_db()
    assert machine.state == M.READY
    return machine


def test_mach14_an_idle_machine_drains_is_cordoned_and_is_deleted_when_proved_gone():
    row = configure()
    machine = ready_machine(row)
    idle = timedelta(minutes=10)
    machines.step(T0 + idle - timedelta(seconds=5))
    machine.refresh_from_db()
    assert machine.state == M.READY  # not idle long enough yet

    machines.step(T0 + idle + timedelta(seconds=15))
    machine.refresh_from_db()
    assert machine.state == M.DELETING  # drained, no runner left: straight to deleting
    assert Host.objects.get(pk=machine.host_id).cordoned  # MACH-12
    machines.step(T0 + idle + timedelta(seconds=20))  # the delete is asked for
    machines.step(T0 + idle + timedelta(seconds=25))  # and proved by an inspect
    machine.refresh_from_db()
    assert machine.state == M.DELETED
    assert the_fake(row).inspect(machine.name) is None


def test_mach13_demand_that_returns_cancels_the_drain(monkeypatch):
    row = configure()
    machine = ready_machine(row)
    from fleet.transitions import transition_machine  # noqa: PLC0415

    transition_machine(machine.pk, M.DRAINING, now=T0, actor="test")
    Host.objects.filter(pk=machine.host_id).update(cordoned=True)
    # A runner still on it keeps it draining; new demand arrives meanwhile.
    monkeypatch.setattr(
        machines, "host_facts",
        lambda ids: {i: machines.HostFacts(exists=True, live_runners=1) for i in ids},
    )  # fmt: skip
    queue_jobs(2, at=T0)
    machines.step(T0 + timedelta(minutes=1))
    machine.refresh_from_db()
    assert machine.state == M.READY
    assert not Host.objects.get(pk=machine.host_id).cordoned
    assert Machine.objects.count() == 1  # taken back, not rented anew (its 2 slots cover it)


def test_mach15_nothing_is_rented_from_an_unconfigured_or_disabled_provider():
    make_pool()
    queue_jobs(2, at=T0)
    assert machines.step(T0).lines == []
    configure(enabled=False)
    result = machines.step(T0)
    assert Machine.objects.count() == 0
    assert "no enabled provider serves zoomies-linux-x64" in result.plan.unmet[0].reason


def test_mach19_the_loop_runs_under_its_own_lease_while_a_reconcile_pass_holds_its_own():
    configure()
    make_pool()
    queue_jobs(1, at=T0)
    now = timezone.now()
    assert leases.acquire(RECONCILE_LEASE, holder="box:1:pass", now=now, ttl=timedelta(hours=1))
    assert tasks.machine_loop_task() >= 1  # not held up by the reconcile pass
    assert Machine.objects.count() == 1
    assert leases.acquire(machines.LEASE_NAME, holder="box:2:other", now=now,
                          ttl=timedelta(hours=1))  # fmt: skip
    assert tasks.machine_loop_task() == 0  # one machine loop at a time


def test_mach08_a_quarantined_machine_is_released_only_by_an_operator():
    row = configure()
    machine = ready_machine(row)
    Machine.objects.filter(pk=machine.pk).update(state=M.QUARANTINED)
    for minutes in (1, 20, 60):
        machines.step(T0 + timedelta(minutes=minutes))
    machine.refresh_from_db()
    assert machine.state == M.QUARANTINED and the_fake(row).inspect(machine.name) is not None
    assert machines.release(machine, now=T0, actor="user:ada")
    machine.refresh_from_db()
    assert machine.state == M.DELETED
    assert the_fake(row).inspect(machine.name) is not None  # its resource left alone


def test_mach08_mach09_a_release_never_records_a_deleting_machine_deleted():
    """A release is of a quarantined machine only: one deleting goes to deleted after the
    inspect that proves its resource gone (MACH-09), never on an operator's word."""
    row = configure()
    machine = ready_machine(row)
    Machine.objects.filter(pk=machine.pk).update(state=M.DELETING)
    assert not machines.release(machine, now=T0, actor="user:ada")
    machine.refresh_from_db()
    assert machine.state == M.DELETING


def test_mach11_a_machine_whose_create_was_never_issued_fails_once_overdue():
    """The provider is down from the moment the machine is planned: nothing is created, and
    past the create timeout the row says so rather than wait in planned for ever."""
    row = configure()
    make_pool()
    queue_jobs(1, at=T0)
    the_fake(row).down = True
    machines.step(T0)
    (machine,) = Machine.objects.all()
    assert machine.state == M.PLANNED
    machines.step(T0 + timedelta(minutes=5))
    machine.refresh_from_db()
    assert machine.state == M.PLANNED  # within the timeout: it may yet be issued
    machines.step(T0 + timedelta(minutes=11))
    machine.refresh_from_db()
    assert machine.state == M.FAILED
    assert machine.message.startswith("the create was never issued: provider fake:")
    assert the_fake(row).creates == 0 and machine.identity == ""


def test_mach14_an_operator_drains_a_ready_machine_and_deletes_it():
    row = configure()
    machine = ready_machine(row)
    assert machines.drain(machine, now=T0, actor="user:ada")
    assert Host.objects.get(pk=machine.host_id).cordoned
    assert not machines.drain(machine, now=T0, actor="user:ada")  # a repeat changes nothing
    assert machines.retire(machine, now=T0, actor="user:ada")
    machines.step(T0 + timedelta(seconds=20))
    machines.step(T0 + timedelta(seconds=25))
    machine.refresh_from_db()
    assert machine.state == M.DELETED and the_fake(row).inspect(machine.name) is None
    from accounts.models import AuditLog  # noqa: PLC0415

    actions = list(AuditLog.objects.filter(actor="user:ada").values_list("action", flat=True))
    assert actions == ["machine.deleting", "machine.draining"]
