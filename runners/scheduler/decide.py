"""`decide`: from a snapshot, the plan. Pure: the answer depends on the snapshot alone.

One decision, in order:

1. Starting runners past `provision_timeout` are failed (SCHED-17). From here on they
   hold no slot, count against no cap, and count as failures at `now` for the backoff.
2. Idle runners past the maximum lifetime or their pool's idle timeout are drained
   (SCHED-19, SCHED-21). Busy runners are never touched (SCHED-20).
3. Queued jobs are assigned to one pool each by label (SCHED-04).
4. Pools in name order: demand is queued jobs plus the warm count, less the runners that
   can still take a job, within the cap (SCHED-23..25); then scale-from-zero when no host
   could ever run the pool (SCHED-26), the start backoff (SCHED-22), and placement on the
   eligible host with the most headroom, every pool drawing on one budget (SCHED-05..12).

Every step is about linear in the size of the snapshot: jobs are matched through an index
of pools by label (`matching.PoolIndex`) and hosts found and ranked through indexes and
heaps (`placement.HostIndex`), never by a scan of every pool per job or of every host per
runner; docs/performance.md has the figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from runners.naming import runner_image
from runners.scheduler.matching import assign_jobs, describe_requirements
from runners.scheduler.model import (
    AVAILABLE_STATES,
    FAILED,
    IDLE,
    REMOVED,
    STARTING_STATES,
    TERMINAL_STATES,
    CreateRunner,
    DrainRunner,
    FailRunner,
    HostView,
    JobView,
    Plan,
    PoolBlocked,
    PoolView,
    PoolWait,
    RunnerView,
    ScaleFromZero,
    SchedulerSettings,
    Snapshot,
)
from runners.scheduler.placement import HostIndex, Placed
from runners.scheduler.resources import HostBooks, build_books
from runners.scheduler.text import count, duration


class Hosts(Protocol):
    """What planning asks of the hosts (`placement.HostIndex`; a plain scan in the tests)."""

    def offering(self, pool: PoolView) -> Sequence[HostView]: ...
    def capable(self, pool: PoolView) -> Sequence[HostView]: ...
    def place(self, pool: PoolView, need: int) -> list[Placed]: ...
    def why_no_room(self, pool: PoolView) -> str: ...


JobAssigner = Callable[[Iterable[JobView], Iterable[PoolView]], Mapping[int, tuple[JobView, ...]]]
HostsFactory = Callable[[Iterable[HostView], Mapping[int, HostBooks]], Hosts]


def decide(snapshot: Snapshot) -> Plan:
    """The plan for this snapshot: creates, fails, drains, demand and waits, with reasons."""
    return decide_with(snapshot, assign_jobs, HostIndex)


def decide_with(snapshot: Snapshot, assign: JobAssigner, make_hosts: HostsFactory) -> Plan:
    """`decide`, with the job matching and the host search given.

    Separate so the tests can run the same decision over plain scans and compare plans.
    """
    pools_by_id = {pool.id: pool for pool in snapshot.pools}
    fails = provision_timeouts(snapshot, pools_by_id)
    failed_ids = frozenset(fail.runner_id for fail in fails)
    drains = idle_drains(snapshot, pools_by_id, failed_ids)
    jobs_by_pool = assign(snapshot.queued_jobs, snapshot.pools)
    drains += surplus_drains(
        snapshot, pools_by_id, jobs_by_pool, failed_ids | {d.runner_id for d in drains}
    )
    drained_ids = frozenset(drain.runner_id for drain in drains)

    books = build_books(snapshot.hosts, snapshot.runners, pools_by_id, released=failed_ids)
    hosts = make_hosts(snapshot.hosts, books)
    runners_by_pool: dict[int, list[RunnerView]] = {}
    for runner in snapshot.runners:
        runners_by_pool.setdefault(runner.pool_id, []).append(runner)

    creates: list[CreateRunner] = []
    demand: list[ScaleFromZero] = []
    waits: list[PoolWait] = []
    blocked: list[PoolBlocked] = []
    for pool in sorted(snapshot.pools, key=lambda p: (p.name, p.id)):
        outcome = _plan_pool(
            pool,
            snapshot,
            runners_by_pool.get(pool.id, []),
            jobs_by_pool.get(pool.id, ()),
            hosts,
            failed_ids,
            drained_ids,
        )
        creates.extend(outcome.creates)
        demand.extend(outcome.demand)
        waits.extend(outcome.waits)
        blocked.extend(outcome.blocked)

    return Plan(
        creates=tuple(creates),
        fails=tuple(fails),
        drains=tuple(drains),
        demand=tuple(demand),
        waits=tuple(waits),
        blocked=tuple(blocked),
    )


def provision_timeouts(
    snapshot: Snapshot, pools_by_id: Mapping[int, PoolView]
) -> tuple[FailRunner, ...]:
    """Fail every runner still provisioning or registering after `provision_timeout`.

    One timeout covers both states, counted from the row's creation, so time spent queued
    on the agent counts too (SCHED-17).
    """
    timeout = snapshot.settings.provision_timeout
    fails = []
    for runner in sorted(snapshot.runners, key=lambda r: r.id):
        if runner.state in STARTING_STATES and snapshot.now - runner.created_at >= timeout:
            fails.append(
                FailRunner(
                    runner_id=runner.id,
                    reason=(
                        f"runner {runner.id} in {_pool_name(pools_by_id, runner.pool_id)} "
                        f"not online {duration(timeout)} after it was created "
                        f"(scheduler.provision_timeout); it was still {runner.state}"
                    ),
                )
            )
    return tuple(fails)


def idle_drains(
    snapshot: Snapshot, pools_by_id: Mapping[int, PoolView], skip: frozenset[int]
) -> tuple[DrainRunner, ...]:
    """Drain idle runners past the maximum lifetime or their idle timeout.

    Only idle runners: a busy one is finishing somebody's job (SCHED-19..21). A timeout
    that is None or not positive is off.
    """
    settings = snapshot.settings
    lifetime = settings.max_runner_lifetime
    drains = []
    for runner in sorted(snapshot.runners, key=lambda r: r.id):
        if runner.state != IDLE or runner.id in skip:
            continue
        pool = pools_by_id.get(runner.pool_id)
        pool_name = _pool_name(pools_by_id, runner.pool_id)
        age = snapshot.now - runner.created_at
        if lifetime is not None and _positive(lifetime) and age >= lifetime:
            drains.append(
                DrainRunner(
                    runner_id=runner.id,
                    reason=(
                        f"idle runner {runner.id} in {pool_name} is {duration(age)} old, past "
                        f"the maximum lifetime of {duration(lifetime)} "
                        "(scheduler.max_runner_lifetime)"
                    ),
                )
            )
            continue
        idle_timeout, source = _idle_timeout(pool, settings)
        idle_for = snapshot.now - runner.state_changed_at
        if idle_timeout is not None and _positive(idle_timeout) and idle_for >= idle_timeout:
            drains.append(
                DrainRunner(
                    runner_id=runner.id,
                    reason=(
                        f"runner {runner.id} in {pool_name} idle for {duration(idle_for)}, past "
                        f"the idle timeout of {duration(idle_timeout)} ({source})"
                    ),
                )
            )
    return tuple(drains)


def surplus_drains(
    snapshot: Snapshot,
    pools_by_id: Mapping[int, PoolView],
    jobs_by_pool: Mapping[int, Sequence[object]],
    skip: frozenset[int],
) -> tuple[DrainRunner, ...]:
    """Idle runners beyond what their pool stands for (its warm count and its queued jobs),
    idle for `surplus_idle_timeout`, the longest idle first (issue 21 item 18). The pool's
    own idle timeout, where set, is judged before this by `idle_drains`."""
    timeout = snapshot.settings.surplus_idle_timeout
    if timeout is None or not _positive(timeout):
        return ()
    drains = []
    idle_by_pool: dict[int, list[RunnerView]] = {}
    for runner in snapshot.runners:
        if runner.state == IDLE and runner.id not in skip:
            idle_by_pool.setdefault(runner.pool_id, []).append(runner)
    for pool_id, idle in sorted(idle_by_pool.items()):
        pool = pools_by_id.get(pool_id)
        wanted = (pool.warm if pool is not None else 0) + len(jobs_by_pool.get(pool_id, ()))
        surplus = len(idle) - wanted
        for runner in sorted(idle, key=lambda r: (r.state_changed_at, r.id))[: max(0, surplus)]:
            idle_for = snapshot.now - runner.state_changed_at
            if idle_for < timeout:
                continue
            drains.append(
                DrainRunner(
                    runner_id=runner.id,
                    reason=(
                        f"runner {runner.id} in {_pool_name(pools_by_id, pool_id)} idle for "
                        f"{duration(idle_for)} beyond what the pool stands for ({wanted} warm "
                        f"or queued), past {duration(timeout)} "
                        "(scheduler.surplus_idle_timeout)"
                    ),
                )
            )
    return tuple(drains)


def start_backoff(
    pool: PoolView,
    pool_runners: Sequence[RunnerView],
    failing_now: int,
    now: datetime,
    settings: SchedulerSettings,
) -> PoolWait | None:
    """The pool's start backoff, or None when it may create now (SCHED-22).

    The failures are the pool's failed runners still inside `failed_retention` that never
    came online (a failed start), plus `failing_now` failed by this very decision (stamped
    `now`). With n of them the wait is start_backoff * 2**(n-1), capped at
    max_start_backoff and at the retention (the failures it is computed from are gone by
    then), counted from the latest failure. A runner that came online and then failed (its
    host was lost, or joined again) says nothing about starting: counting those held a
    pool's every start for minutes after one host went away.
    """
    retention = settings.failed_retention
    times = [
        _failed_at(runner)
        for runner in pool_runners
        if runner.state == FAILED
        and not runner.came_online
        and now - _failed_at(runner) < retention
    ]
    times.extend([now] * failing_now)
    if not times:
        return None
    wait = backoff_wait(len(times), settings)
    until = max(times) + wait
    if now >= until:
        return None
    return PoolWait(
        pool_id=pool.id,
        until=until,
        reason=(
            f"{pool.name} waits {duration(until - now)} more before creating another runner: "
            f"{count(len(times), 'failed start')} in the last {duration(retention)}, so a "
            f"backoff of {duration(wait)} (scheduler.start_backoff)"
        ),
    )


def backoff_wait(failures: int, settings: SchedulerSettings) -> timedelta:
    """start_backoff doubled per failure after the first, capped (SCHED-22)."""
    cap = min(settings.max_start_backoff, settings.failed_retention)
    wait = settings.start_backoff
    # Doubling step by step, stopping at the cap, so many failures cannot overflow.
    for _ in range(failures - 1):
        if wait >= cap or wait <= timedelta(0):
            break
        wait *= 2
    return max(timedelta(0), min(wait, cap))


class _PoolOutcome:
    """What planning one pool produced; a plain bag, local to one decision."""

    def __init__(self) -> None:
        self.creates: list[CreateRunner] = []
        self.demand: list[ScaleFromZero] = []
        self.waits: list[PoolWait] = []
        self.blocked: list[PoolBlocked] = []


def _plan_pool(
    pool: PoolView,
    snapshot: Snapshot,
    pool_runners: Sequence[RunnerView],
    pool_jobs: Sequence[JobView],
    hosts: Hosts,
    failed_ids: frozenset[int],
    drained_ids: frozenset[int],
) -> _PoolOutcome:
    """Demand, scale-from-zero, backoff and placement for one pool, charging the books."""
    out = _PoolOutcome()
    live = sum(1 for r in pool_runners if r.state not in TERMINAL_STATES and r.id not in failed_ids)
    ready = [
        r
        for r in pool_runners
        if r.state in AVAILABLE_STATES and r.id not in failed_ids and r.id not in drained_ids
    ]
    available = len(ready)
    jobs = len(pool_jobs)
    # A runner that just ran a job we have not heard of yet stands for that job, which
    # still looks queued here (webhooks reordered or dropped until the next poll).
    unheard = min(jobs, _unlinked_exits(pool_runners, snapshot))
    jobs -= unheard
    # Scale on demand, never one runner per job id: an idle runner takes any matching job
    # of its own installation, and only those (POLL-05: one installation must not starve
    # another).
    serving, spare = _serving(ready, pool_jobs)
    wanted = max(0, jobs - serving) + max(0, pool.warm - spare)
    if wanted == 0:
        return out
    if pool.paused:
        out.blocked.append(
            PoolBlocked(
                pool.id,
                wanted,
                f"{pool.name} is paused, so it gets no new runner "
                f"({_demand_text(jobs, pool.warm, available)})",
            )
        )
        return out
    cap_room = max(0, pool.max_runners - live)
    need = min(wanted, cap_room)
    if need < wanted:
        out.blocked.append(
            PoolBlocked(
                pool.id,
                wanted - need,
                # Every number agrees with the others (issue 21 item 6): "held back by
                # its cap of 4 (it has 0 live)" read as a contradiction.
                f"{count(wanted, 'runner')} wanted in {pool.name}, its cap of "
                f"{pool.max_runners} leaves room for {cap_room} ({live} live), so "
                f"{wanted - need} wait for a runner to end",
            )
        )
    if need == 0:
        return out

    if not hosts.capable(pool):
        _no_host_could_run(out, pool, hosts.offering(pool), jobs, available, need)
        return out

    failing_now = sum(1 for r in pool_runners if r.id in failed_ids)
    wait = start_backoff(pool, pool_runners, failing_now, snapshot.now, snapshot.settings)
    if wait is not None:
        out.waits.append(wait)
        return out

    try:
        image = runner_image(pool.image, pool.platform, pool.backend, dind=pool.dind)
    except ValueError as exc:
        out.blocked.append(PoolBlocked(pool.id, need, f"{pool.name} cannot start runners: {exc}"))
        return out

    placed = hosts.place(pool, need)
    if placed:
        details = _demand_text(jobs, pool.warm, available)
        if need < wanted:
            details += f", capped at {pool.max_runners} runners"
        if len(placed) < need:
            details += f", {need - len(placed)} more wait for room"
        reason = f"create {len(placed)} in {pool.name}: {details}"
        out.creates.extend(
            CreateRunner(
                pool_id=pool.id,
                host_id=host_id,
                image=image,
                cpus=charge_cpus,
                memory_mb=charge_memory,
                reason=reason,
                placement=placement,
            )
            for host_id, charge_cpus, charge_memory, placement in placed
        )
    if len(placed) < need:
        out.blocked.append(
            PoolBlocked(
                pool.id,
                need - len(placed),
                f"{count(need - len(placed), 'more runner')} wanted in {pool.name} "
                f"{'waits' if need - len(placed) == 1 else 'wait'} for room: "
                + hosts.why_no_room(pool),
            )
        )
    return out


def _no_host_could_run(
    out: _PoolOutcome,
    pool: PoolView,
    offering: Sequence[HostView],
    jobs: int,
    available: int,
    need: int,
) -> None:
    """Report demand no host in the fleet could ever run (SCHED-26).

    Only the part queued jobs ask for becomes scale-from-zero demand: a warm count alone
    is no reason to rent a machine, so it is a note.
    """
    requirements = describe_requirements(pool)
    if offering:
        missing = f"no host offering {requirements} has room for one runner ({_size(pool)})"
    else:
        missing = f"no host offers {requirements}"
    job_need = min(need, max(0, jobs - available))
    if job_need:
        out.demand.append(
            ScaleFromZero(
                pool_id=pool.id,
                count=job_need,
                missing=missing,
                reason=(
                    f"{count(job_need, 'runner')} wanted in {pool.name} "
                    f"({_demand_text(jobs, pool.warm, available)}), but {missing}"
                ),
            )
        )
    if need > job_need:
        out.blocked.append(
            PoolBlocked(
                pool.id,
                need - job_need,
                f"{count(need - job_need, 'warm runner')} wanted in {pool.name}, but {missing}",
            )
        )


def _size(pool: PoolView) -> str:
    """What one runner of the pool is charged where it typed figures."""
    containers = 2 if pool.dind else 1
    parts = []
    if pool.cpus is not None:
        parts.append(f"{pool.cpus * containers:g} CPUs")
    if pool.memory_mb is not None:
        parts.append(f"{pool.memory_mb * containers} MB")
    return " and ".join(parts) or "one slot"


def _unlinked_exits(pool_runners: Sequence[RunnerView], snapshot: Snapshot) -> int:
    """Removed runners that ended cleanly within the grace with no job linked to them."""
    grace = snapshot.settings.unlinked_exit_grace
    return sum(
        1
        for r in pool_runners
        if r.unlinked_exit
        and r.state == REMOVED
        and r.finished_at is not None
        and snapshot.now - r.finished_at < grace
    )


def _serving(ready: Sequence[RunnerView], jobs: Sequence[JobView]) -> tuple[int, int]:
    """(how many queued jobs the available runners can take, how many are left spare).

    A runner registered in one installation cannot run another's job, so for a pool that
    serves several installations an idle runner of one does not stand for a job of the
    other; a runner or job of no known installation matches any. With one installation
    (or none known) this is `min(available, jobs)` and the rest spare, as before.
    """
    runners_at = Counter(r.installation_id for r in ready)
    jobs_at = Counter(j.installation_id for j in jobs)
    serving = 0
    for inst, ready_here in list(runners_at.items()):
        if inst is not None:
            taken = min(ready_here, jobs_at.get(inst, 0))
            serving += taken
            runners_at[inst] -= taken
            jobs_at[inst] -= taken
    # Runners of no known installation take any job left; any runner left takes a job of
    # no known installation.
    anywhere = runners_at.pop(None, 0)
    taken = min(anywhere, sum(n for inst, n in jobs_at.items() if inst is not None))
    serving, anywhere = serving + taken, anywhere - taken
    spare = anywhere + sum(runners_at.values())
    taken = min(spare, jobs_at.get(None, 0))
    return serving + taken, spare - taken


def _demand_text(jobs: int, warm: int, available: int) -> str:
    """ "2 jobs queued, warm 1, 1 already idle or starting"."""
    parts = []
    if jobs:
        parts.append(f"{count(jobs, 'job')} queued")
    if warm:
        parts.append(f"warm {warm}")
    if available:
        parts.append(f"{available} already idle or starting")
    return ", ".join(parts) or "no demand"


def _idle_timeout(
    pool: PoolView | None, settings: SchedulerSettings
) -> tuple[timedelta | None, str]:
    """The idle timeout that applies to a pool's runners, and where it came from."""
    if pool is not None and pool.idle_timeout is not None:
        return pool.idle_timeout, f"{pool.name}'s idle timeout"
    return settings.default_idle_timeout, "the default idle timeout"


def _failed_at(runner: RunnerView) -> datetime:
    """When a failed runner failed: finished_at, stamped on entry to failed."""
    return runner.finished_at if runner.finished_at is not None else runner.state_changed_at


def _positive(span: timedelta | None) -> bool:
    return span is not None and span > timedelta(0)


def _pool_name(pools_by_id: Mapping[int, PoolView], pool_id: int) -> str:
    pool = pools_by_id.get(pool_id)
    return pool.name if pool is not None else f"pool {pool_id}"
