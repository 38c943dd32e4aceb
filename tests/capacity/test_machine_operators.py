"""Issue 23 item 7, what operators are told about rented machines: the zoomies_machines gauge,
the machine loop's record of a provider it cannot reach, and the problems list (a provider
down, a quarantined machine, a machine stuck in a passing state)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from accounts.models import AuditLog
from capacity import machines
from fleet import provider_actions
from fleet.models import Machine
from fleet.problems import LISTED, STUCK_AFTER
from fleet.states import MachineState as M
from tests.capacity.machine_cast import (
    T0,
    configure,
    machine_loop,  # noqa: F401  # the fixture
    planned,
    queue_demand,
    rent,
    the_fake,
)
from zoomies_site.metrics_view import exposition
from zoomies_site.problems import problems

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("machine_loop")]


def gauge(name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition().decode())
        for s in family.samples
        if s.name == name
    }


def keyed(now) -> dict[str, dict]:
    return {p["key"]: p for p in problems(now)}


# -- /metrics -------------------------------------------------------------------------------


def test_the_machines_gauge_counts_machines_by_state_and_provider_at_scrape_time():
    row = configure()
    quarantined = rent(row, M.QUARANTINED)
    planned("fake")
    planned("other")
    planned("other")
    assert gauge("zoomies_machines") == {
        (("provider", "fake"), ("state", "quarantined")): 1,
        (("provider", "fake"), ("state", "planned")): 1,
        (("provider", "other"), ("state", "planned")): 2,
    }
    machines.release(quarantined, now=T0, actor="test")  # deleted rows are not counted
    assert gauge("zoomies_machines") == {
        (("provider", "fake"), ("state", "planned")): 1,
        (("provider", "other"), ("state", "planned")): 2,
    }


# -- the loop's record of outages ------------------------------------------------------------


def test_a_provider_the_loop_cannot_reach_is_recorded_down_and_cleared_once_it_answers():
    row = configure()
    fake = the_fake(row)
    machine = rent(row, M.PLANNED)  # the provider was down in that round
    row.refresh_from_db()
    assert row.down_since == T0 and row.last_error == "fake cannot be reached"
    (down,) = AuditLog.objects.filter(action="provider.down")
    assert down.actor == "system:machines" and down.detail == {"error": "fake cannot be reached"}

    machines.step(T0 + timedelta(seconds=5))  # still down: the outage keeps its start
    row.refresh_from_db()
    assert row.down_since == T0
    assert AuditLog.objects.filter(action="provider.down").count() == 1

    fake.down = False
    machines.step(T0 + timedelta(seconds=10))
    row.refresh_from_db()
    assert (row.down_since, row.last_error) == (None, "")
    assert AuditLog.objects.get(action="provider.up").detail["error"] == "fake cannot be reached"
    machine.refresh_from_db()
    assert machine.state == M.BOOTSTRAPPING  # and its create went through


def test_a_provider_with_no_work_is_still_asked_before_its_outage_is_cleared():
    """Nothing else asks a provider with no machine to step: silence must not clear it."""
    row = configure()
    other = configure("other", pools=[])
    the_fake(other).down = True
    provider_actions.record_outage(other, error="other cannot be reached", now=T0, actor="t")
    machines.step(T0 + timedelta(seconds=5))
    other.refresh_from_db()
    assert other.down_since == T0  # asked, and still down
    the_fake(other).down = False
    machines.step(T0 + timedelta(seconds=10))
    other.refresh_from_db()
    assert other.down_since is None
    row.refresh_from_db()
    assert row.down_since is None  # never down, never recorded


def test_a_disabled_provider_is_not_asked_and_the_problems_list_leaves_it_alone():
    row = configure()
    provider_actions.record_outage(row, error="fake cannot be reached", now=T0, actor="t")
    provider_actions.update_provider(row, {"enabled": False}, actor="t", now=T0)
    the_fake(row).down = True
    machines.step(T0 + timedelta(seconds=5))
    row.refresh_from_db()
    assert row.down_since == T0  # neither asked again nor cleared unasked
    assert "provider.down:fake" not in keyed(T0 + timedelta(seconds=5))


# -- the problems list ----------------------------------------------------------------------


def test_a_provider_that_is_down_is_a_problem_naming_it_since_when_and_why():
    row = configure()
    rent(row, M.PLANNED)
    found = keyed(T0 + timedelta(minutes=3))["provider.down:fake"]
    assert found["severity"] == "error"
    assert found["title"] == "Machine provider fake cannot be reached"
    assert "since 2026-01-05 12:00:00 UTC (3 min ago): fake cannot be reached" in found["detail"]
    the_fake(row).down = False
    machines.step(T0 + timedelta(minutes=4))
    assert "provider.down:fake" not in keyed(T0 + timedelta(minutes=4))


def test_issue24_a_provider_refusing_its_creates_is_one_problem_with_the_count_and_why():
    """A template that vanished (or a full cluster): the provider answers, and says no to
    each create; the loop plans again each round, and the problems list names the provider
    once, with how many it refused in the last hour and the latest reason."""
    row = configure()
    fake = the_fake(row)
    fake.refusing = "template 9000 not found in the cluster"
    queue_demand(pool=row.pools[0])
    machines.step(T0)
    machines.step(T0 + timedelta(minutes=1))
    assert set(Machine.objects.values_list("state", flat=True)) == {M.FAILED}
    found = keyed(T0 + timedelta(minutes=2))["provider.refusing:fake"]
    assert found["severity"] == "error"
    assert "refused in the last hour" in found["detail"]
    assert "template 9000 not found in the cluster" in found["detail"]
    assert "provider.down:fake" not in keyed(T0 + timedelta(minutes=2))
    fake.refusing = ""
    assert "provider.refusing:fake" not in keyed(T0 + timedelta(hours=2))  # an hour on


def test_mach08_a_quarantined_machine_is_a_problem_until_it_is_released():
    machine = rent(configure(), M.QUARANTINED)
    found = keyed(T0 + timedelta(minutes=1))[f"machine.quarantined:{machine.name}"]
    assert found["title"] == f"Machine {machine.name} is quarantined and needs an operator"
    assert f"{machine.name} no longer carries our mark" in found["detail"]
    assert "release it on the Machines page" in found["detail"]
    machines.release(machine, now=T0, actor="test")
    assert not [k for k in keyed(T0 + timedelta(minutes=1)) if k.startswith("machine.")]


@pytest.mark.parametrize("until", [M.PLANNED, M.BOOTSTRAPPING, M.ENROLLING])
def test_a_machine_stuck_in_a_passing_state_past_15_minutes_is_a_problem(until):
    machine = rent(configure(), until)
    since = machine.state_changed_at
    assert f"machine.stuck:{machine.name}" not in keyed(since + STUCK_AFTER - timedelta(seconds=1))
    found = keyed(since + STUCK_AFTER + timedelta(minutes=1))[f"machine.stuck:{machine.name}"]
    assert found["title"] == f"Machine {machine.name} has been {until} for 16 min"
    assert f"has been {until} since {since:%Y-%m-%d %H:%M:%S} UTC (16 min ago)" in found["detail"]
    assert f"Its last word: {machine.message}" in found["detail"]


def test_a_machine_at_rest_is_never_stuck():
    """Ready, draining, failed and deleted are not states a machine passes through."""
    row = configure()
    ready = rent(row, M.READY)
    later = T0 + timedelta(hours=5)
    assert not [k for k in keyed(later) if k.startswith("machine.")]
    assert machines.retire(ready, now=T0, actor="test")  # deleting is passing
    assert f"machine.stuck:{ready.name}" in keyed(later)


def test_past_the_listed_many_the_rest_are_counted_in_one_entry():
    for _ in range(LISTED + 3):
        planned()
    found = keyed(T0 + timedelta(hours=1))
    assert len([k for k in found if k.startswith("machine.stuck:")]) == LISTED
    assert found["machine.stuck.more"]["title"] == "3 more machine(s) stuck for over 15 min"
