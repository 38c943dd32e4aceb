"""Property tests over random fleets: what no plan may ever do, whatever the fleet.

Each check is written against an oracle in this file (a plain restatement of the rule),
not against the scheduler's own helpers, so a broken helper cannot vouch for itself.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runners.scheduler import (
    HostView,
    JobView,
    Plan,
    PoolView,
    RunnerView,
    SchedulerSettings,
    Snapshot,
    decide,
)

from .builders import NOW, apply_plan

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

STATES = ("provisioning", "registering", "idle", "busy", "draining", "failed", "removed")
PLATFORMS = (None, "linux/x64", "linux/arm64", "windows/x64")
BACKENDS = ("docker", "podman", "process")
POOL_LABELS = ("a", "b", "gpu")
JOB_LABELS = ("self-hosted", "linux", "x64", "arm64", "windows", "a", "b", "gpu")
SELECTOR = (("gpu", "a100"), ("zone", "b"))
LIVE = {"provisioning", "registering", "idle", "busy", "draining"}
AVAILABLE = {"provisioning", "registering", "idle"}
EPSILON = 1e-6


def subset(items: tuple, min_size: int = 0) -> st.SearchStrategy[tuple]:
    return st.lists(st.sampled_from(items), min_size=min_size, unique=True).map(tuple)


@st.composite
def pools(draw: st.DrawFn) -> tuple[PoolView, ...]:
    n = draw(st.integers(1, 4))
    names = draw(st.permutations([f"zoomies-p{i}" for i in range(n)]))
    return tuple(
        PoolView(
            id=i + 1,
            name=names[i],
            labels=draw(subset(POOL_LABELS)),
            backend=draw(st.sampled_from(BACKENDS)),
            platform=draw(st.sampled_from(PLATFORMS)),
            host_selector=draw(subset(SELECTOR)),
            image=draw(st.sampled_from(("", "", "registry.local/runner:1"))),
            cpus=draw(st.sampled_from((None, None, 0.5, 1.0, 2.0, 3.0))),
            memory_mb=draw(st.sampled_from((None, None, 512, 1024, 4096))),
            dind=draw(st.booleans()),
            warm=draw(st.integers(0, 2)),
            max_runners=draw(st.sampled_from((0, 1, 3, 6, 10, 10, 10))),
            paused=draw(st.sampled_from((False,) * 7 + (True,))),
            idle_timeout=draw(
                st.sampled_from(
                    (None, timedelta(seconds=30), timedelta(minutes=5), timedelta(hours=1))
                )
            ),
            installation_id=draw(st.sampled_from((None, None, 1, 2))),
        )
        for i in range(n)
    )


@st.composite
def hosts(draw: st.DrawFn, the_pools: tuple[PoolView, ...]) -> tuple[HostView, ...]:
    """Hosts, most of them shaped after some pool so that placement is exercised."""
    made = []
    for i in range(draw(st.integers(0, 4))):
        backends = draw(subset(BACKENDS, min_size=1))
        platform = draw(st.sampled_from(PLATFORMS))
        labels = draw(subset(SELECTOR))
        if draw(st.sampled_from((True, True, True, False))):
            template = draw(st.sampled_from(the_pools))
            backends = tuple(dict.fromkeys((template.backend, *backends)))
            platform = draw(st.sampled_from((template.platform, None)))
            labels = tuple(dict.fromkeys((*template.host_selector, *labels)))
        made.append(
            HostView(
                id=i + 1,
                name=f"zoomies-h{i + 1}",
                healthy=draw(st.sampled_from((True, True, True, False))),
                cordoned=draw(st.sampled_from((False, False, False, True))),
                backends=backends,
                platform=platform,
                labels=labels,
                capacity=draw(st.sampled_from((0, 1, 2, 3, 4, 6))),
                cpus=draw(st.sampled_from((None, 1.0, 2.0, 4.0, 8.0))),
                memory_mb=draw(st.sampled_from((None, 1024, 4096, 8192))),
                pressure_hold=draw(st.sampled_from((False, False, False, True))),
            )
        )
    return tuple(made)


@st.composite
def fleets(draw: st.DrawFn) -> Snapshot:
    the_pools = draw(pools())
    the_hosts = draw(hosts(the_pools))
    pool_ids = [p.id for p in the_pools] + [99]  # 99: a pool deleted under its runners.
    host_ids = [h.id for h in the_hosts] + [None, 77]  # None: unplaced; 77: a gone host.
    runners = []
    for i in range(draw(st.integers(0, 10))):
        state = draw(st.sampled_from(STATES))
        # Mostly young rows, so timeouts and backoff do not silence every pool.
        young = draw(st.sampled_from((True, True, True, False)))
        age = timedelta(seconds=draw(st.integers(0, 600 if young else 3 * 3600)))
        in_state = timedelta(seconds=draw(st.integers(0, int(age.total_seconds()))))
        finished = None
        if state in ("failed", "removed"):
            finished = NOW - timedelta(seconds=draw(st.integers(0, 20 * 60)))
        runners.append(
            RunnerView(
                id=i + 1,
                pool_id=draw(st.sampled_from(pool_ids)),
                host_id=draw(st.sampled_from(host_ids)),
                state=state,
                created_at=NOW - age,
                state_changed_at=NOW - in_state,
                finished_at=finished,
                cpus=draw(st.sampled_from((None, None, 0.5, 2.0))),
                memory_mb=draw(st.sampled_from((None, None, 512, 2048))),
                dind=draw(st.booleans()),
                # A runner still starting has not come online (the pass sees to that).
                came_online=state not in ("provisioning", "registering") and draw(st.booleans()),
            )
        )
    jobs = []
    for _ in range(draw(st.integers(0, 10))):
        # Mostly labels some pool answers to, sometimes anything at all.
        target = draw(st.sampled_from(the_pools))
        labels = draw(subset(tuple(sorted(implied_labels(target))), min_size=1))
        if draw(st.sampled_from((False, False, False, True))):
            labels = draw(subset(JOB_LABELS, min_size=1))
        jobs.append(
            JobView(
                id=draw(st.integers(1, 15)),  # Duplicate ids happen: a job seen twice.
                labels=tuple(label.upper() if draw(st.booleans()) else label for label in labels),
                repository="octo/app",
                installation_id=draw(st.sampled_from((None, None, 1, 2))),
                created_at=NOW - timedelta(seconds=30),
            )
        )
    scheduler_settings = SchedulerSettings(
        max_runner_lifetime=draw(st.sampled_from((None, timedelta(hours=1)))),
        default_idle_timeout=draw(st.sampled_from((None, timedelta(minutes=30)))),
    )
    return Snapshot(
        now=NOW,
        pools=the_pools,
        hosts=the_hosts,
        runners=tuple(runners),
        queued_jobs=tuple(jobs),
        settings=scheduler_settings,
    )


# The oracle: the rules restated plainly.


def implied_labels(pool: PoolView) -> set[str]:
    labels = {label.lower() for label in pool.labels} | {"self-hosted"}
    if pool.platform:
        labels |= set(pool.platform.split("/"))
    return labels


def matches(job: JobView, pool: PoolView) -> bool:
    same_installation = (
        pool.installation_id is None
        or job.installation_id is None
        or pool.installation_id == job.installation_id
    )
    return same_installation and {label.lower() for label in job.labels} <= implied_labels(pool)


def offers(host: HostView, pool: PoolView) -> bool:
    platform_ok = pool.platform is None or host.platform is None or pool.platform == host.platform
    return (
        pool.backend in host.backends
        and platform_ok
        and set(pool.host_selector) <= set(host.labels)
    )


def expected_charge(
    cpus: float | None, memory_mb: int | None, dind: bool, host: HostView
) -> tuple[float, int]:
    """The charge rule: typed figures (twice for dind), else a floored slot share."""
    k = 2 if dind else 1
    slots = host.capacity
    share_cpu = math.floor(host.cpus / slots * 100 + 1e-9) / 100 if host.cpus and slots else 0.0
    share_mem = host.memory_mb // slots if host.memory_mb and slots else 0
    return (
        cpus * k if cpus is not None else share_cpu,
        memory_mb * k if memory_mb is not None else share_mem,
    )


def books_after(snap: Snapshot, plan: Plan) -> dict[int, tuple[int, float, int]]:
    """(slots, cpus, memory) each host holds once the plan is applied."""
    pools = {p.id: p for p in snap.pools}
    hosts = {h.id: h for h in snap.hosts}
    failed = {f.runner_id for f in plan.fails}
    used = {h: [0, 0.0, 0] for h in hosts}
    for r in snap.runners:
        if r.state not in LIVE or r.id in failed or r.host_id not in hosts:
            continue
        pool = pools.get(r.pool_id)
        rule = expected_charge(
            pool.cpus if pool else None,
            pool.memory_mb if pool else None,
            r.dind or bool(pool and pool.dind),
            hosts[r.host_id],
        )
        used[r.host_id][0] += 1
        used[r.host_id][1] += r.cpus if r.cpus is not None else rule[0]
        used[r.host_id][2] += r.memory_mb if r.memory_mb is not None else rule[1]
    for c in plan.creates:
        used[c.host_id][0] += 1
        used[c.host_id][1] += c.cpus or 0.0
        used[c.host_id][2] += c.memory_mb or 0
    return {h: (s, cpu, mem) for h, (s, cpu, mem) in used.items()}


def check_sched05_08_09_10_no_host_is_over_filled(snap: Snapshot, plan: Plan) -> None:
    """A host given a runner ends within its slots, CPUs and memory, all pools together."""
    after = books_after(snap, plan)
    hosts = {h.id: h for h in snap.hosts}
    for host_id in {c.host_id for c in plan.creates}:
        host = hosts[host_id]
        slots, cpus, memory = after[host_id]
        assert slots <= host.capacity, (host, slots)
        if host.cpus is not None:
            assert cpus <= host.cpus + EPSILON, (host, cpus)
        if host.memory_mb is not None:
            assert memory <= host.memory_mb, (host, memory)


def check_sched05_06_10_11_creates_go_to_eligible_hosts_charged_by_the_rule(
    snap: Snapshot, plan: Plan
) -> None:
    """Only healthy, uncordoned, unpressured hosts that offer the pool; the right charge."""
    pools = {p.id: p for p in snap.pools}
    hosts = {h.id: h for h in snap.hosts}
    for c in plan.creates:
        pool, host = pools[c.pool_id], hosts[c.host_id]
        assert host.healthy and not host.cordoned and not host.pressure_hold, host
        assert offers(host, pool), (host, pool)
        assert not pool.paused
        cpus, memory = expected_charge(pool.cpus, pool.memory_mb, pool.dind, host)
        assert (c.cpus or 0.0) == cpus and (c.memory_mb or 0) == memory, (c, pool, host)
        # BACK-16: a pool that provides Docker runs the stock tag's Docker variant.
        stock = "ghcr.io/zoomies/runner:latest" + ("-docker" if pool.dind else "")
        assert c.image == (pool.image or stock) or (
            pool.backend == "process" and c.image == "actions-runner"
        )
        assert c.reason.startswith(
            f"create {sum(1 for x in plan.creates if x.pool_id == pool.id)} in {pool.name}: "
        )


def check_sched23_24_25_creates_never_exceed_demand_or_the_cap(snap: Snapshot, plan: Plan) -> None:
    """Demand and cap bound the creates; no queued job brings up two runners."""
    failed = {f.runner_id for f in plan.fails}
    drained = {d.runner_id for d in plan.drains}
    created = Counter(c.pool_id for c in plan.creates)

    # A job id seen twice is one job: it counts for a pool if any copy matches it.
    def jobs_matching(pool_list: tuple[PoolView, ...]) -> int:
        return len({j.id for j in snap.queued_jobs if any(matches(j, p) for p in pool_list)})

    job_driven = 0
    for pool in snap.pools:
        mine = [r for r in snap.runners if r.pool_id == pool.id]
        live = sum(1 for r in mine if r.state in LIVE and r.id not in failed)
        available = sum(1 for r in mine if r.state in AVAILABLE and r.id not in failed | drained)
        matching = jobs_matching((pool,))
        n = created[pool.id]
        assert n <= max(0, matching + pool.warm - available), pool
        if n:
            assert live + n <= pool.max_runners, pool
            assert not pool.paused
        job_driven += max(0, n - max(0, pool.warm - available))
    # Never two runners for one queued job: job-driven creates fit in the jobs there are.
    assert job_driven <= jobs_matching(snap.pools)


def check_sched22_no_creates_while_a_pool_is_in_backoff(snap: Snapshot, plan: Plan) -> None:
    """A pool with a failure younger than the shortest backoff, or failing now, waits."""
    s = snap.settings
    for pool in snap.pools:
        recent = [
            r.finished_at
            for r in snap.runners
            if r.pool_id == pool.id
            and r.state == "failed"
            and not r.came_online
            and r.finished_at is not None
            and snap.now - r.finished_at < s.failed_retention
        ]
        fails_now = [
            f
            for f in plan.fails
            if any(r.id == f.runner_id and r.pool_id == pool.id for r in snap.runners)
        ]
        if (recent and max(recent) + s.start_backoff > snap.now) or fails_now:
            assert not any(c.pool_id == pool.id for c in plan.creates), pool


def check_sched17_19_20_21_only_starting_runners_fail_only_idle_ones_drain(
    snap: Snapshot, plan: Plan
) -> None:
    """Fails hit only timed-out starts, drains only idle runners, nothing a busy one."""
    by_id = {r.id: r for r in snap.runners}
    for fail in plan.fails:
        runner = by_id[fail.runner_id]
        assert runner.state in ("provisioning", "registering")
        assert snap.now - runner.created_at >= snap.settings.provision_timeout
    for drain in plan.drains:
        assert by_id[drain.runner_id].state == "idle"
    touched = [a.runner_id for a in (*plan.fails, *plan.drains)]
    assert len(touched) == len(set(touched))
    assert all(by_id[i].state != "busy" for i in touched)
    for action in plan.actions():
        assert action.reason.strip()


def check_sched26_scale_from_zero_only_when_no_host_offers_the_pool(
    snap: Snapshot, plan: Plan
) -> None:
    """Scale-from-zero only where no host of the fleet could ever run the pool."""
    pools = {p.id: p for p in snap.pools}
    for demand in plan.demand:
        pool = pools[demand.pool_id]
        assert demand.count > 0 and not pool.paused
        assert demand.missing in demand.reason
        capable = [h for h in snap.hosts if offers(h, pool) and h.capacity > 0]
        too_small = [
            h
            for h in capable
            if (
                h.cpus is not None
                and pool.cpus is not None
                and pool.cpus * (1 + pool.dind) > h.cpus
            )
            or (
                h.memory_mb is not None
                and pool.memory_mb is not None
                and pool.memory_mb * (1 + pool.dind) > h.memory_mb
            )
        ]
        assert len(capable) == len(too_small), (pool, capable)
        assert not any(c.pool_id == pool.id for c in plan.creates)


INVARIANTS = (
    check_sched05_08_09_10_no_host_is_over_filled,
    check_sched05_06_10_11_creates_go_to_eligible_hosts_charged_by_the_rule,
    check_sched23_24_25_creates_never_exceed_demand_or_the_cap,
    check_sched22_no_creates_while_a_pool_is_in_backoff,
    check_sched17_19_20_21_only_starting_runners_fail_only_idle_ones_drain,
    check_sched26_scale_from_zero_only_when_no_host_offers_the_pool,
)


@PROPERTY
@given(fleets())
def test_sched05_to_26_every_plan_keeps_the_invariants(snap: Snapshot) -> None:
    """One generated fleet, every invariant: generating fleets is what costs time."""
    plan = decide(snap)
    for check in INVARIANTS:
        check(snap, plan)


@PROPERTY
@given(fleets())
def test_sched28_deciding_again_after_applying_the_plan_creates_nothing(snap: Snapshot) -> None:
    """Apply the plan as the reconcile pass would, decide again: nothing more to create."""
    plan = decide(snap)
    again = decide(apply_plan(snap, plan))
    assert again.creates == (), again.creates
    assert again.fails == () and again.drains == ()


@PROPERTY
@given(fleets(), st.randoms(use_true_random=False))
def test_sched02_the_plan_does_not_depend_on_the_order_of_the_snapshot(snap: Snapshot, rnd) -> None:  # type: ignore[no-untyped-def]
    """Rows arrive in whatever order a query returns them; the plan must not care."""

    def shuffled(items: tuple) -> tuple:
        items = list(items)
        rnd.shuffle(items)
        return tuple(items)

    reordered = Snapshot(
        now=snap.now,
        pools=shuffled(snap.pools),
        hosts=shuffled(snap.hosts),
        runners=shuffled(snap.runners),
        queued_jobs=shuffled(snap.queued_jobs),
        settings=snap.settings,
    )
    assert decide(reordered) == decide(snap)
