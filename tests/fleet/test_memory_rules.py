"""A host's memory rules from its rows (HOST-24, HOST-25) and the loans its agent reports
(HOST-29): recorded only upwards, and charged by the placement ledger until the runner ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet import protocol
from fleet.actions import memory_rules_for, record_heartbeat
from fleet.errors import InvalidRequest
from fleet.memory import memory_plan_for
from fleet.models import Host
from fleet.rest_api import HostSerializer, host_queryset
from runners import host_facts
from runners.models import Job, Pool, Runner
from runners.reconcile import build_snapshot
from runners.scheduler import decide
from tests.fleet.test_throttling import gauge

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)


@pytest.fixture
def host(registry_defaults):
    return Host.objects.create(
        name="zoomies-h1", capacity=4, cpus=4.0, memory_mb=16000, backends=["docker"],
        last_heartbeat_at=T0 - timedelta(seconds=10),
    )  # fmt: skip


@pytest.fixture
def pool():
    return Pool.objects.create(name="zoomies-big", labels=["big"], backend="docker",
                               memory_mb=3000, max_runners=4)  # fmt: skip


def runner(pool, host, state, memory_mb, lent=0, n=[0]) -> Runner:  # noqa: B006
    n[0] += 1
    return Runner.objects.create(
        name=f"zoomies-big-{n[0]}", pool=pool, host=host, state=state, memory_mb=memory_mb,
        lent_memory_mb=lent, created_at=T0, state_changed_at=T0, online_at=T0,
    )  # fmt: skip


def test_host24_host25_the_rules_come_from_the_rows_the_queue_and_the_last_sample(host, pool):
    busy = runner(pool, host, "busy", 3000, lent=500)
    runner(pool, host, "idle", 2000)
    runner(pool, host, "idle", 3000)
    runner(pool, host, "removed", 9000)  # ended: charged nothing
    plan = memory_plan_for(host)
    floor = 16000 // 20
    assert plan.rules.capacity_mb == 16000 - floor - (3000 + 3000) - 500  # no job queued
    assert plan.rules.rule_for(busy.pk).ceiling_mb == 4500
    Job.objects.create(github_id=1, run_id=1, repository="acme/app", labels=["big"],
                       status="queued", created_at=T0, updated_at=T0)  # fmt: skip
    held = memory_plan_for(host).rules.capacity_mb
    assert held == plan.rules.capacity_mb - 4000  # the larger of the pool's 3000 and a share
    # The agent measured 6000 MB used: the loan is capped by what is free beyond the floor.
    Host.objects.filter(pk=host.pk).update(usage={"memory_used_mb": 14000}, usage_at=T0)
    capped = memory_plan_for(Host.objects.get(pk=host.pk))
    assert capped.rules.capacity_mb == 2000 - floor and "measured free" in capped.reason


def test_host29_loans_are_recorded_only_upwards_and_only_for_live_runners_of_that_host(host, pool):
    one, done = runner(pool, host, "busy", 1000), runner(pool, host, "removed", 1000)
    other = Host.objects.create(name="zoomies-h2", capacity=1, memory_mb=1000)
    assert host_facts.record_memory_loans(host, {one.pk: 256, done.pk: 512}) == 1
    assert host_facts.record_memory_loans(host, {one.pk: 128}) == 0  # late and smaller
    assert host_facts.record_memory_loans(other, {one.pk: 1024}) == 0  # not its runner
    one.refresh_from_db()
    done.refresh_from_db()
    assert (one.lent_memory_mb, done.lent_memory_mb) == (256, 0)


def test_host29_the_placement_ledger_charges_a_loan_until_the_runner_ends(host, pool):
    """Three 3000 MB runners and 4000 lent fill a 16000 MB host past a fourth's room."""
    for _ in range(3):
        runner(pool, host, "busy", 3000)
    Job.objects.create(github_id=2, run_id=2, repository="acme/app", labels=["big"],
                       status="queued", created_at=T0, updated_at=T0)  # fmt: skip
    assert len(decide(build_snapshot(T0)).creates) == 1
    Runner.objects.filter(pool=pool).update(lent_memory_mb=1500)
    assert decide(build_snapshot(T0)).creates == ()
    Runner.objects.filter(pool=pool).update(state="removed")  # ended: the loans go with them
    assert len(decide(build_snapshot(T0)).creates) == 1


def test_host24_a_heartbeat_answer_is_unchanged_for_a_host_with_no_memory_figure(host):
    Host.objects.filter(pk=host.pk).update(memory_mb=None)
    assert memory_plan_for(Host.objects.get(pk=host.pk)) is None
    assert record_heartbeat(host=Host.objects.get(pk=host.pk), facts={}, now=T0)


def test_host24_host32_each_heartbeat_answer_carries_the_rules_and_counts_the_loans_it_reports(
    host, pool, registry_defaults
):
    one = runner(pool, host, "busy", 2000)
    answer = protocol.HeartbeatAnswer.from_json(record_heartbeat(host=host, facts={}, now=T0))
    assert answer.memory is not None and not answer.memory.observe
    assert answer.memory.rule_for(one.pk).ceiling_mb == 3000
    before = answer.memory.capacity_mb
    # The agent lent 512 MB: recorded first, so this very answer lends from what is left.
    body = {"memory_loans": {str(one.pk): 512}, "memory_blocked": {str(one.pk): "at its ceiling"}}
    again = protocol.HeartbeatAnswer.from_json(
        record_heartbeat(host=Host.objects.get(pk=host.pk), facts=body, now=T0)
    )
    assert again.memory.capacity_mb == before - 512
    one.refresh_from_db()
    assert one.lent_memory_mb == 512 and one.memory_blocked == "at its ceiling"
    assert host_facts.memory_blocked_now(one, T0 + timedelta(minutes=14)) == "at its ceiling"
    assert host_facts.memory_blocked_now(one, T0 + timedelta(minutes=15)) == ""  # HOST-32
    registry_defaults.set("agent.memory_valve", "observe")
    watched = protocol.HeartbeatAnswer.from_json(record_heartbeat(host=host, facts={}, now=T0))
    assert watched.memory.observe
    registry_defaults.set("agent.memory_valve", "off")
    assert "memory" not in record_heartbeat(host=host, facts={}, now=T0)


def test_host24_a_heartbeat_with_a_malformed_memory_report_is_refused_clearly(host):
    for bad in ({"memory_loans": {"x": 1}}, {"memory_loans": {"1": -5}},
                {"memory_blocked": {"1": 7}}, {"memory_loans": []}):  # fmt: skip
        with pytest.raises(InvalidRequest) as caught:
            record_heartbeat(host=host, facts=bad, now=T0)
        assert "memory_" in str(caught.value)


def test_host24_the_rules_cross_the_wire_intact():
    rules = protocol.MemoryRules(
        capacity_mb=900, floor_mb=100, observe=True,
        runners=(protocol.RunnerMemoryRule(7, 1000, 1500, 0),),
    )  # fmt: skip
    wire = protocol.HeartbeatAnswer(memory=rules).to_json()
    assert protocol.HeartbeatAnswer.from_json(wire).memory == rules
    assert "memory" not in protocol.HeartbeatAnswer().to_json()


def test_host29_the_hosts_api_and_metrics_show_what_each_host_has_lent(host, pool):
    """Issue 25 item 5: the host's loans summed over its live runners (an ended one's loan
    is no longer charged), on the API and as a gauge; a host lending nothing adds no series."""
    assert gauge("zoomies_host_memory_lent_mb") == {}
    runner(pool, host, "busy", 1000, lent=256)
    runner(pool, host, "idle", 1000, lent=128)
    runner(pool, host, "removed", 1000, lent=999)
    (row,) = HostSerializer(host_queryset(), many=True).data
    assert row["lent_memory_mb"] == 384
    assert gauge("zoomies_host_memory_lent_mb") == {(("host", "zoomies-h1"),): 384.0}


def test_host31_what_an_observing_valve_would_have_lent_is_recorded_and_never_charged(
    host, pool, registry_defaults
):
    registry_defaults.set("agent.memory_valve", "observe")
    one = runner(pool, host, "busy", 2000)
    first = protocol.HeartbeatAnswer.from_json(record_heartbeat(host=host, facts={}, now=T0))
    body = {"memory_would_lend": {str(one.pk): 640}}
    again = protocol.HeartbeatAnswer.from_json(
        record_heartbeat(host=Host.objects.get(pk=host.pk), facts=body, now=T0)
    )
    one.refresh_from_db()
    assert (one.lent_memory_mb, one.would_lend_memory_mb) == (0, 640)
    assert again.memory.capacity_mb == first.memory.capacity_mb  # nothing was lent


def test_host24_a_host_with_nothing_to_lend_to_costs_its_heartbeat_one_query(
    host, pool, django_assert_max_num_queries
):
    """The heartbeat's hot path: a host whose runners have no memory limit (or none at all)
    is asked one question for the valve, not the held-back start's three more."""
    runner(pool, host, "busy", None)
    Job.objects.create(github_id=3, run_id=3, repository="acme/app", labels=["big"],
                       status="queued", created_at=T0, updated_at=T0)  # fmt: skip
    fresh = Host.objects.get(pk=host.pk)
    # The registry's mode (a read in a savepoint, which a test's transaction shows as three
    # statements) and the runners: not the queued jobs, the slots nor the pools.
    with django_assert_max_num_queries(4):
        assert memory_rules_for(fresh) is None
