"""The provider conformance suite (MACH-17): one set of tests every provider runs, the fake
and Proxmox VE against its fake cluster over HTTPS (issue 24, MACH-18).

Each test drives a machine row through `fleet.machines.step_machine` against a provider made
to misbehave as real ones do, and checks the lifecycle's promises: the identity is written
down before the create (MACH-04), every move out of creating follows an observation and a
timeout is not a failure (MACH-05), a lost answer is resolved by asking who owns the
identity and never by a second create (MACH-06), nothing that cannot be proved ours is
deleted (MACH-07, 08, 16), deleted only once an inspect cannot find it (MACH-09), and failed
is not final (MACH-10).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

import fleet.providers
from fleet.machines import HostFacts, Timeouts, plan_machine, step_machine
from fleet.models import Machine
from fleet.providers.contract import MachineSpec, Mark, Observed, Power, Provider
from fleet.providers.fake import FakeProvider
from fleet.providers.proxmox.fake import FakeProxmoxServer
from fleet.providers.proxmox.provider import ProxmoxProvider
from fleet.states import MachineState as M
from tests.fleet.conftest import T0, later
from tests.fleet.providers import pve
from tests.purity import imports_of, impurities

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("registry_defaults")]

OURS = Mark("zoomies-test-controller")
TIMEOUTS = Timeouts(
    create=timedelta(minutes=5),
    boot=timedelta(minutes=5),
    join=timedelta(minutes=5),
    delete=timedelta(minutes=5),
    redelete=timedelta(seconds=30),
)


class FakeHarness:
    """The fake provider's misbehaviours, as the suite asks for them."""

    def __init__(self) -> None:
        self.provider = FakeProvider("conformance")

    def lose_next_create_answer(self) -> None:
        self.provider.lose_next_create_answer()

    def slow_next_create(self, looks: int) -> None:
        self.provider.slow_next_create(looks)

    def next_delete_lies(self, times: int = 1) -> None:
        self.provider.next_delete_lies(times)

    def add_foreign(self, identity: str) -> None:
        self.provider.add_foreign(identity)

    def go_down(self) -> None:
        self.provider.down = True

    def come_up(self) -> None:
        self.provider.down = False

    def creates(self) -> int:
        return self.provider.creates

    def exists(self, identity: str) -> bool:
        with_down, self.provider.down = self.provider.down, False
        try:
            return self.provider.inspect(identity) is not None
        finally:
            self.provider.down = with_down


class _HarnessedProxmox(ProxmoxProvider):
    """The Proxmox provider with the few hooks the suite reaches for on `harness.provider`,
    each carried out on the fake cluster behind it (never by the provider itself)."""

    server: FakeProxmoxServer

    @property
    def deletes(self) -> int:
        return self.server.fake.count("DELETE", r"/qemu/\d+$")

    def remove_behind_our_back(self, identity: str) -> None:
        self.server.fake.remove_named(identity)

    @property
    def boot_as(self) -> Power:
        return Power.STOPPED if self.server.fake.faults.halt_first_boot else Power.RUNNING

    @boot_as.setter
    def boot_as(self, power: Power) -> None:
        # A guest that powers itself off on its first boot: the create finds it stopped.
        self.server.fake.faults.halt_first_boot = power == Power.STOPPED


class ProxmoxHarness:
    """Issue 24 item 3 (MACH-18, FAKE-05): the same misbehaviours, by the fake Proxmox over
    real HTTPS. A lost create answer is a lost clone answer; a slow create is a clone whose
    answer is lost and whose VM stays out of the listings for `looks` of them; a lying
    delete is a destroy task that ends OK with the VM still there; a stranger is a VM of our
    name without our tag (outside our pool, ids from 5000)."""

    def __init__(self) -> None:
        self.server = pve.serve()
        self.fake = self.server.fake
        self.provider = pve.provider(self.server, cls=_HarnessedProxmox)
        self.provider.server = self.server
        self._foreign_ids = iter(range(5000, 6000))

    def close(self) -> None:
        self.server.stop()
        self.provider.client.close()

    def lose_next_create_answer(self) -> None:
        # As the fake provider's: the machine is built (the clone task ended), then the
        # answer is lost. A clone still running when it is asked about: test_proxmox.py.
        self.fake.lose_next("POST", r"/clone$", after_task=True)

    def slow_next_create(self, looks: int) -> None:
        self.fake.lose_next("POST", r"/clone$")
        self.fake.faults.hide_next_clone = looks

    def next_delete_lies(self, times: int = 1) -> None:
        self.fake.faults.lying_deletes += times

    def add_foreign(self, identity: str) -> None:
        self.fake.add_vm(next(self._foreign_ids), name=identity, status="running")

    def go_down(self) -> None:
        self.server.pause()

    def come_up(self) -> None:
        self.server.resume()

    def creates(self) -> int:
        return self.fake.count("POST", r"/clone$")

    def exists(self, identity: str) -> bool:
        return self.fake.vm_named(identity) is not None


HARNESSES = {"fake": FakeHarness, "proxmox": ProxmoxHarness}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request):
    made = HARNESSES[request.param]()
    yield made
    if isinstance(made, ProxmoxHarness):
        # FAKE-05: nothing the provider sent in the whole test broke the API's schema.
        assert made.fake.refused_requests() == []
        made.close()


HOST_UP = HostFacts(exists=True)


def step(machine: Machine, provider: Provider, now, *, host: HostFacts = HOST_UP) -> str:
    machine.refresh_from_db()
    return step_machine(
        machine,
        provider,
        mark=OURS,
        now=now,
        timeouts=TIMEOUTS,
        bootstrap=lambda m: {"claim_code": f"code-for-{m.name}"},
        host_facts=lambda m: host,
        cordon=lambda h: None,
    )


def state_of(machine: Machine) -> str:
    machine.refresh_from_db()
    return machine.state


def planned() -> Machine:
    return plan_machine(provider="conformance", pool_id=None, now=T0, reason="a test")


def test_mach04_the_identity_is_on_the_row_before_the_create_is_issued(harness):
    seen = []
    provider = harness.provider
    real = provider.create

    def create(spec: MachineSpec) -> Observed:
        row = Machine.objects.get(name=spec.identity)
        seen.append((row.state, row.identity, row.create_issued_at))
        return real(spec)

    provider.create = create
    machine = planned()
    assert (machine.state, machine.identity) == (M.PLANNED, "")  # the row before anything
    step(machine, provider, T0)
    assert seen == [(M.CREATING, machine.name, T0)]
    assert state_of(machine) == M.BOOTSTRAPPING


def test_mach05_mach06_a_lost_create_answer_is_resolved_by_asking_never_by_a_second_create(
    harness,
):
    harness.lose_next_create_answer()
    machine = planned()
    step(machine, harness.provider, T0)
    assert state_of(machine) == M.CREATING  # not failed: the answer was lost, not refused
    assert "answer was lost" in Machine.objects.get(pk=machine.pk).message
    step(machine, harness.provider, later(10))
    assert state_of(machine) == M.BOOTSTRAPPING  # the inspect found it, ours
    assert harness.creates() == 1


def test_mach05_a_create_that_times_out_and_appears_later_is_waited_for(harness):
    harness.slow_next_create(looks=3)
    machine = planned()
    step(machine, harness.provider, T0)
    for seconds in (10, 20, 30):  # not found yet: within the create timeout, no verdict
        step(machine, harness.provider, later(seconds))
        assert state_of(machine) == M.CREATING
    step(machine, harness.provider, later(40))
    assert state_of(machine) == M.BOOTSTRAPPING
    assert harness.creates() == 1


def test_mach10_failed_is_not_final_a_sweep_that_finds_it_deletes_it(harness):
    harness.slow_next_create(looks=5)
    machine = planned()
    step(machine, harness.provider, T0)
    step(machine, harness.provider, later(minutes=6))  # past the create timeout, not found
    assert state_of(machine) == M.FAILED
    for minute in range(7, 12):
        step(machine, harness.provider, later(minutes=minute))
    assert state_of(machine) == M.DELETING  # it appeared, ours: the sweep took it
    step(machine, harness.provider, later(minutes=12))  # the delete is asked for
    step(machine, harness.provider, later(minutes=13))  # and seen through
    assert state_of(machine) == M.DELETED
    assert not harness.exists(machine.identity)
    assert harness.creates() == 1


def test_mach07_mach16_a_stranger_with_our_identity_is_quarantined_and_never_deleted(harness):
    machine = planned()
    harness.add_foreign(machine.name)  # somebody else's machine took the name first
    step(machine, harness.provider, T0)  # our create is refused: the name is taken
    assert state_of(machine) == M.FAILED
    for minute in range(1, 4):  # the sweep sees it, but it is not ours: left alone
        step(machine, harness.provider, later(minutes=minute))
    assert state_of(machine) == M.FAILED
    assert harness.exists(machine.name)


def test_mach07_a_lost_answer_that_finds_a_stranger_quarantines(harness):
    harness.lose_next_create_answer()
    machine = planned()
    step(machine, harness.provider, T0)
    # Our create was lost and a stranger now answers to the identity (say ours never
    # happened and someone else's did): the outcome cannot be resolved.
    harness.provider.remove_behind_our_back(machine.name)
    harness.add_foreign(machine.name)
    step(machine, harness.provider, later(10))
    assert state_of(machine) == M.QUARANTINED
    assert harness.exists(machine.name)


def test_mach08_nothing_automatic_acts_on_a_quarantined_machine(harness):
    machine = planned()
    harness.add_foreign(machine.name)
    Machine.objects.filter(pk=machine.pk).update(state=M.QUARANTINED, identity=machine.name)
    deletes = harness.provider.deletes
    for minute in range(0, 30, 5):
        assert step(machine, harness.provider, later(minutes=minute)) == ""
    assert state_of(machine) == M.QUARANTINED
    assert harness.provider.deletes == deletes and harness.exists(machine.name)


def to_deleting(harness) -> Machine:
    machine = planned()
    step(machine, harness.provider, T0)
    assert state_of(machine) == M.BOOTSTRAPPING
    Machine.objects.filter(pk=machine.pk).update(state=M.DELETING)
    return machine


def test_mach09_a_delete_that_answers_ok_is_not_taken_as_gone(harness):
    machine = to_deleting(harness)
    harness.next_delete_lies()
    step(machine, harness.provider, later(1))  # asked; it answered OK and lives on
    step(machine, harness.provider, later(2))
    assert state_of(machine) == M.DELETING
    assert harness.exists(machine.identity)
    step(machine, harness.provider, later(40))  # asked again after redelete
    step(machine, harness.provider, later(41))
    assert state_of(machine) == M.DELETED
    assert not harness.exists(machine.identity)


def test_mach07_a_delete_never_confirmed_quarantines(harness):
    machine = to_deleting(harness)
    harness.next_delete_lies(times=1000)
    for seconds in range(0, 6 * 60, 30):
        step(machine, harness.provider, later(seconds + 1))
    assert state_of(machine) == M.QUARANTINED
    assert harness.exists(machine.identity)


def test_mach16_a_machine_that_lost_our_mark_is_never_deleted(harness):
    machine = to_deleting(harness)
    harness.provider.remove_behind_our_back(machine.identity)
    harness.add_foreign(machine.identity)  # replaced by somebody else's under the name
    step(machine, harness.provider, later(1))
    assert state_of(machine) == M.QUARANTINED
    assert harness.exists(machine.identity)


def test_a_provider_that_is_down_changes_no_machine(harness):
    harness.lose_next_create_answer()
    machine = planned()
    step(machine, harness.provider, T0)
    harness.go_down()
    for minute in range(1, 20):  # past every timeout: nothing is concluded from silence
        with pytest.raises(Exception, match="cannot be reached"):
            step(machine, harness.provider, later(minutes=minute))
    assert state_of(machine) == M.CREATING
    harness.come_up()
    step(machine, harness.provider, later(minutes=21))
    assert state_of(machine) == M.BOOTSTRAPPING
    assert harness.creates() == 1


def test_a_stopped_machine_is_started_and_only_then_bootstrapping(harness):
    harness.provider.boot_as = Power.STOPPED
    machine = planned()
    step(machine, harness.provider, T0)
    assert state_of(machine) == M.STARTING
    step(machine, harness.provider, later(5))  # started
    step(machine, harness.provider, later(10))
    assert state_of(machine) == M.BOOTSTRAPPING


def test_every_provider_obeys_the_contracts_shape(harness):
    assert isinstance(harness.provider, Provider)
    assert harness.provider.inspect("zm-nobody") is None


def test_mach17_the_contract_and_its_fake_hold_no_sql_no_http_and_no_fleet_policy():
    """MACH-17: the contract imports the standard library alone (no ORM, no HTTP client, no
    fleet module), the fake imports nothing but the contract, and the conformance suite
    above runs against every provider kind the machine loop knows, the fake included."""
    root = Path(fleet.providers.__file__).parent
    allowed = {"__future__", "re", "dataclasses", "enum", "typing", "collections.abc"}
    assert impurities(root / "contract.py", allowed) == []
    fake_imports = imports_of((root / "fake.py").read_text()) - allowed - {"threading"}
    assert fake_imports == {"fleet.providers.contract"}, fake_imports
    assert {"fake", "proxmox"} <= set(HARNESSES)
