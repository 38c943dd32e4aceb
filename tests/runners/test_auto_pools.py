"""The automatic pools (issue 27 item 1, SCHED-29..33): the pure plan, its reconciler's own
loop and lease, the narrow conditional writes, host silence and the size-class hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounts.models import AuditLog
from fleet.models import Host
from runners import auto_pools, tasks
from runners.actions import pools as pool_actions
from runners.models import Pool
from runners.pool_views import pool_view
from runners.scheduler import auto_pools as plan
from runners.scheduler.auto_pools import AutoHost, AutoPoolSnapshot, plan_auto_pools
from tests.purity import impurities
from zoomies_site.core import leases, registry
from zoomies_site.core.models import Lease

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def host(name, platform="linux/x64", *, capacity=4, cpus=16.0, memory_mb=32768,
         backends=("docker",), heard=T0):  # fmt: skip
    return AutoHost(name=name, platform=platform, backends=tuple(backends), capacity=capacity,
                    cpus=cpus, memory_mb=memory_mb, heard_at=heard)  # fmt: skip


def snapshot(hosts, pools=(), *, now=T0, started=T0 - 60 * MIN):
    return AutoPoolSnapshot(now=now, controller_started_at=started, host_grace=10 * MIN,
                            size_class_hold=10 * MIN, hosts=tuple(hosts),
                            pools=tuple(pools))  # fmt: skip


def settle(snap):
    """The plan, and the pools as they are once it is applied."""
    made = plan_auto_pools(snap)
    return made, plan.applied(snap, made)


# -- SCHED-29: the pure plan ---------------------------------------------------------------


def test_sched29_the_planner_reads_no_clock_and_imports_nothing_impure():
    allowed = {"__future__", "collections", "dataclasses", "datetime"}
    assert impurities(Path(plan.__file__), allowed) == []


def test_sched29_one_pool_per_platform_labelled_sized_and_on_the_backend_most_hosts_offer():
    hosts = [
        host("a", capacity=4, cpus=16, memory_mb=32768, backends=("docker", "process")),
        host("b", capacity=4, cpus=8, memory_mb=16384, backends=("podman", "docker")),
        host("c", "linux/arm64", capacity=2, cpus=2, memory_mb=4096, backends=("podman",)),
        host("d", platform=""),  # an agent that said no platform shapes nothing
    ]
    made = plan_auto_pools(snapshot(hosts)).actions
    by_key = {a.auto_key: a for a in made}
    assert sorted(by_key) == ["auto:linux/arm64", "auto:linux/x64"]
    x64 = by_key["auto:linux/x64"]
    assert x64.pool_id is None and x64.name == "zoomies-auto-linux-x64"
    assert x64.shape.labels == ("self-hosted", "linux", "x64") and x64.shape.backend == "docker"
    # b's slot is 2 CPUs and 4 GB: the largest class both hosts have a slot of.
    assert (x64.shape.size_class, x64.shape.cpus, x64.shape.memory_mb) == ("medium", 2.0, 4096)
    arm = by_key["auto:linux/arm64"]
    assert (arm.shape.size_class, arm.shape.backend) == ("small", "podman")
    assert x64.reason == "made: 2 host(s) of linux/x64, size medium"


def test_sched29_hosts_that_never_said_their_size_make_an_unsized_pool():
    (action,) = plan_auto_pools(snapshot([host("a", cpus=None, memory_mb=None)])).actions
    assert (action.shape.size_class, action.shape.cpus, action.shape.memory_mb) == (
        "unsized", None, None)  # fmt: skip


HOSTS = st.lists(
    st.builds(
        host,
        name=st.sampled_from(["a", "b", "c", "d", "e"]),
        platform=st.sampled_from(["linux/x64", "linux/arm64", "windows/x64", ""]),
        capacity=st.integers(1, 16),
        cpus=st.one_of(st.none(), st.floats(0.5, 128)),
        memory_mb=st.one_of(st.none(), st.integers(256, 512 * 1024)),
        backends=st.lists(st.sampled_from(["docker", "podman", "process", "vm"]), max_size=3),
        heard=st.one_of(st.none(), st.integers(-120, 0).map(lambda m: T0 + m * MIN)),
    ),
    max_size=6,
    unique_by=lambda h: h.name,
)


@settings(max_examples=300, deadline=None)
@given(before=HOSTS, after=HOSTS, elapsed=st.integers(0, 60))
def test_sched29_planning_over_its_own_result_changes_nothing(before, after, elapsed):
    """Whatever the pools were left as by an earlier fleet, planning the current fleet, then
    planning again over that plan's result at the same moment, asks for nothing."""
    first = snapshot(before, now=T0 - elapsed * MIN)
    _made, pools = settle(first)
    now = snapshot(after, pools)
    made, pools = settle(now)
    again = plan_auto_pools(snapshot(after, pools))
    assert again.actions == (), (made, again)
    assert all(a.reason for a in made.actions)


# -- SCHED-32: silence counts from the later of the last heartbeat and the start -----------


def test_sched32_a_silent_host_reshapes_nothing_within_the_grace_and_a_restart_resets_it():
    _made, pools = settle(snapshot([host("a")]))
    quiet = snapshot([host("a", heard=T0 - 9 * MIN)], pools)
    assert plan_auto_pools(quiet).actions == ()  # 9 minutes: still counted
    gone = snapshot([host("a", heard=T0 - 11 * MIN)], pools)
    (retired,) = plan_auto_pools(gone).actions
    assert retired.shape.active is False
    assert retired.reason == "retired: no host of linux/x64 heard from within 10 min"
    # The controller started 2 minutes ago: an hour-old heartbeat counts from the start.
    restarted = snapshot([host("a", heard=T0 - 60 * MIN)], pools, started=T0 - 2 * MIN)
    assert plan_auto_pools(restarted).actions == ()
    # A retired pool comes back with its hosts.
    _made, retired_pools = settle(gone)
    (revived,) = plan_auto_pools(snapshot([host("a")], retired_pools)).actions
    assert revived.shape.active and revived.reason.startswith("revived:")


# -- SCHED-33: a size class is held --------------------------------------------------------


def test_sched33_a_size_class_is_held_ten_minutes_before_it_changes_again():
    big = host("a", capacity=1, cpus=8, memory_mb=16384)
    _made, pools = settle(snapshot([big]))
    assert pools[0].shape.size_class == "xlarge" and pools[0].size_class_since == T0
    small = host("b", capacity=4, cpus=4, memory_mb=8192)
    held = snapshot([big, small], pools, now=T0 + 9 * MIN)
    assert plan_auto_pools(held).actions == ()  # the class is held; nothing else changed
    with_podman = host("b", capacity=4, cpus=4, memory_mb=8192, backends=("podman",))
    held_but = snapshot([big, with_podman, host("c", backends=("podman",))], pools,
                        now=T0 + 9 * MIN)  # fmt: skip
    (action,) = plan_auto_pools(held_but).actions
    assert action.shape.size_class == "xlarge" and action.shape.backend == "podman"
    assert "size xlarge held until 12:10:00 (not small)" in action.reason
    later = snapshot([big, small], pools, now=T0 + 10 * MIN)
    (changed,) = plan_auto_pools(later).actions
    assert changed.shape.size_class == "small" and changed.size_class_since == T0 + 10 * MIN


# -- SCHED-31: the controller's columns, conditioned on the operator's ---------------------


def make_host(name, platform="linux/x64", **facts):
    return Host.objects.create(name=name, platform=platform, capacity=facts.pop("capacity", 4),
                               cpus=facts.pop("cpus", 16), memory_mb=facts.pop("memory_mb", 32768),
                               backends=["docker"], last_heartbeat_at=facts.pop("heard", T0),
                               **facts)  # fmt: skip


@pytest.fixture
def on(registry_defaults):
    registry_defaults.set("scheduler.auto_pools", "true")
    return registry_defaults


@pytest.mark.django_db
def test_sched31_a_pass_makes_the_pool_and_writes_only_the_controllers_columns(on):
    make_host("a")
    lines = auto_pools.step(T0, started_at=T0 - 60 * MIN)
    assert lines == ["zoomies-auto-linux-x64: made: 1 host(s) of linux/x64, size large"]
    pool = Pool.objects.get(auto_key="auto:linux/x64")
    assert (pool.warm, pool.paused, pool.installation_id) == (0, False, None)
    Pool.objects.filter(pk=pool.pk).update(warm=2, max_runners=7, image="ghcr.io/acme/r:1")
    make_host("b", capacity=8, cpus=8, memory_mb=8192)
    Host.objects.update(last_heartbeat_at=T0 + 11 * MIN)
    assert auto_pools.step(T0 + 11 * MIN, started_at=T0 - 60 * MIN) == [
        "zoomies-auto-linux-x64: reshaped: 2 host(s) of linux/x64; "
        "cpus, memory_mb, size_class changed"
    ]
    pool.refresh_from_db()
    assert (pool.size_class, pool.cpus, pool.memory_mb) == ("small", 1.0, 2048)
    assert (pool.warm, pool.max_runners, pool.image) == (2, 7, "ghcr.io/acme/r:1")
    audited = AuditLog.objects.filter(action="pool.auto_update").get()
    assert audited.actor == auto_pools.ACTOR and "reshaped" in audited.detail["reason"]
    assert auto_pools.step(T0 + 12 * MIN, started_at=T0 - 60 * MIN) == []


@pytest.mark.django_db
def test_sched31_an_operators_edit_saved_during_a_pass_is_never_put_back(on):
    make_host("a")
    auto_pools.step(T0, started_at=T0)
    Host.objects.all().delete()  # every host silent: the plan retires the pool
    snap, read = auto_pools.build_snapshot(T0 + 11 * MIN, started_at=T0)
    (action,) = plan_auto_pools(snap).actions
    pool = Pool.objects.get(auto_key="auto:linux/x64")
    Pool.objects.filter(pk=pool.pk).update(paused=True)  # the operator, while the pass works
    line = auto_pools.apply(action, read, T0 + 11 * MIN)
    assert line.startswith("zoomies-auto-linux-x64: left for the next pass (changed meanwhile)")
    pool.refresh_from_db()
    assert pool.auto_active and pool.paused
    # The next pass reads the edit and writes its own columns around it.
    assert auto_pools.step(T0 + 12 * MIN, started_at=T0)[0].startswith(
        "zoomies-auto-linux-x64: retired"
    )
    pool.refresh_from_db()
    assert not pool.auto_active and pool.paused


@pytest.mark.django_db
def test_sched31_only_a_pool_with_an_auto_key_and_only_the_controllers_columns(on):
    mine = Pool.objects.create(name="mine", labels=["self-hosted", "linux", "x64"],
                               backend="process")  # fmt: skip
    owned = {"labels": ["x"], "auto_active": False}
    assert not pool_actions.apply_auto_shape(
        mine.pk, auto_key="auto:linux/x64", owned=owned, operator_read={}, reason="r",
        actor="t", now=T0,
    )  # fmt: skip
    mine.refresh_from_db()
    assert mine.labels == ["self-hosted", "linux", "x64"]
    with pytest.raises(ValueError, match="warm"):
        pool_actions.apply_auto_shape(mine.pk, auto_key="k", owned={"warm": 3},
                                      operator_read={}, reason="r", actor="t", now=T0)  # fmt: skip
    # An operator's pool holding the name: the automatic one is not made over it.
    Pool.objects.create(name="zoomies-auto-linux-x64", labels=["x"], backend="process")
    make_host("a")
    assert auto_pools.step(T0, started_at=T0)[0].startswith(
        "zoomies-auto-linux-x64: not made (the name or the key is taken)")  # fmt: skip


@pytest.mark.django_db
def test_sched31_the_api_shows_an_automatic_pool_and_refuses_a_change_of_its_shape(on, admin):
    from tests.accounts.conftest import client_for  # noqa: PLC0415  # the accounts cast

    make_host("a")
    auto_pools.step(T0, started_at=T0)
    pool = Pool.objects.get(auto_key="auto:linux/x64")
    api = client_for(admin)
    shown = api.get(f"/api/v1/pools/{pool.pk}").json()
    assert shown["auto_key"] == "auto:linux/x64" and shown["size_class"] == "large"
    assert shown["auto_active"] is True
    refused = api.patch(f"/api/v1/pools/{pool.pk}", {"labels": ["gpu"]}, format="json")
    assert refused.status_code == 400 and "labels" in refused.json()
    same = api.patch(f"/api/v1/pools/{pool.pk}", {"labels": pool.labels, "warm": 1},
                     format="json")  # fmt: skip
    assert same.status_code == 200, same.content
    pool.refresh_from_db()
    assert pool.warm == 1
    # A form sent back with a shape a pass has changed since does not put it back.
    Pool.objects.filter(pk=pool.pk).update(cpus=1.0)
    pool_actions.update_pool(pool, {"cpus": 8.0, "max_runners": 3}, actor="t", now=T0)
    pool.refresh_from_db()
    assert (pool.cpus, pool.max_runners) == (1.0, 3)


@pytest.mark.django_db
def test_sched29_a_retired_automatic_pool_is_given_no_runner(on):
    make_host("a", heard=T0 - 30 * MIN)
    Pool.objects.create(name="zoomies-auto-linux-x64", auto_key="auto:linux/x64", auto_active=False,
                        labels=["self-hosted", "linux", "x64"], backend="docker")  # fmt: skip
    assert pool_view(Pool.objects.get()).paused


# -- SCHED-30: its own loop, its own lease, a one-slot wake ---------------------------------


@pytest.mark.django_db
def test_sched30_the_pass_holds_its_own_lease_never_the_reconcile_one(on, monkeypatch):
    make_host("a", heard=None)
    Host.objects.update(last_heartbeat_at=None, joined_at=datetime.now(UTC))
    assert leases.acquire(tasks.LEASE_NAME, holder="a reconcile pass", now=datetime.now(UTC),
                          ttl=timedelta(minutes=5))  # fmt: skip
    assert tasks.auto_pools_task().startswith("zoomies-auto-linux-x64: made")
    assert Lease.objects.get(name="auto_pools").holder == ""  # let go after the pass
    assert leases.acquire("auto_pools", holder="another worker", now=datetime.now(UTC),
                          ttl=timedelta(minutes=2))  # fmt: skip
    assert tasks.auto_pools_task() == "another automatic-pool pass is running"
    on.set("scheduler.auto_pools", "false")
    assert tasks.auto_pools_task() == "automatic pools are off (scheduler.auto_pools)"


@pytest.mark.django_db(transaction=True)
def test_sched30_wakes_take_one_slot_and_a_pass_frees_it(on, monkeypatch):
    queued = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda *a, **k: queued.append(a[0]))
    auto_pools.wake_auto_pools()
    auto_pools.wake_auto_pools()
    assert queued == ["runners.tasks.auto_pools_task"]
    tasks.auto_pools_task()  # clears the slot before its pass
    auto_pools.wake_auto_pools()
    assert len(queued) == 2
    on.set("scheduler.auto_pools", "false")
    tasks.auto_pools_task()
    auto_pools.wake_auto_pools()
    assert len(queued) == 2  # off: nothing is woken


@pytest.mark.django_db
def test_sched30_the_ticker_plans_every_minute_only_when_enabled(registry_defaults, monkeypatch):
    from zoomies_site import ticker  # noqa: PLC0415  # the roof's clock, read here only

    enqueued = []
    monkeypatch.setattr(ticker, "enqueue", lambda func, *args: enqueued.append((func, args)))
    job = next(j for j in ticker.default_ticker(T0).jobs if j.name == "auto_pools")
    assert job.every() == timedelta(minutes=1) == plan.AUTO_POOL_INTERVAL
    job.run(T0)
    assert enqueued == []
    registry_defaults.set("scheduler.auto_pools", "true")
    job.run(T0)
    assert enqueued == [("runners.tasks.auto_pools_task", (T0.isoformat(),))]


@pytest.mark.django_db
def test_sched32_the_grace_must_be_above_the_host_lost_time(registry_defaults):
    registry_defaults.set("scheduler.auto_pools_host_grace", "5m")
    keys = [f.key for f in registry.validate()]
    assert "config.auto_pools_grace_not_above_host_lost" in keys
    registry_defaults.set("scheduler.auto_pools_host_grace", "6m")
    assert "config.auto_pools_grace_not_above_host_lost" not in [
        f.key for f in registry.validate()]  # fmt: skip
