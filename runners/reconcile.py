"""The reconcile pass: build a snapshot from rows, decide, apply (spec "A job arrives" 3-5).

Building and applying are separate functions around the pure `runners.scheduler.decide`.
No transaction spans a GitHub call (STORE-02): JIT configurations are minted first,
concurrently, and each runner row is then written with its agent task in one transaction.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections import Counter
from collections.abc import Collection
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings as django_settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from fleet.agent.backends.resources import allocatable, given
from fleet.models import Host
from fleet.states import HostHealth
from fleet.throttling import capacity_of, hold_of
from fleet.wakeups import announce_pending_tasks, notify_host
from runners import naming
from runners.actions import (
    NewRunner,
    create_runner,
    create_runners,
    defer_idle_drain,
    drain_runner,
    fail_runner,
)
from runners.actions.installations import note_mint_failure, note_mint_success
from runners.github.config import get_app
from runners.github.errors import RateLimited
from runners.github.labels import runner_labels
from runners.github.manifest import web_base
from runners.github.programs import process_program
from runners.models import Installation, Job, Pool, Runner
from runners.poller import stand_down, under_standdown
from runners.pool_views import read_pools
from runners.registrations import check_online, deregister_failed, registration_target
from runners.scheduler import (
    CreateRunner,
    HostView,
    JobView,
    Plan,
    RunnerView,
    SchedulerSettings,
    Snapshot,
    assign_jobs,
    decide,
)
from runners.selectors import unlinked_exits
from runners.states import JobStatus, RunnerState
from runners.waits import job_wait_reasons, record_wait_reasons
from runners.wake import clear_wake, wake_reconcile
from zoomies_site.core import leases, metrics, registry

log = logging.getLogger("zoomies.reconcile")

LEASE_NAME = "reconcile"
LEASE_TTL = timedelta(minutes=5)  # longer than any pass; a crashed holder frees it by expiry
ACTOR = "system:reconcile"
JIT_MINT_CONCURRENCY = 8
# The mints' threads, kept between passes: a pool made per pass started a thread on the
# single job's critical path each time (about 2 ms between the decision and the mint here).
_mint_threads = ThreadPoolExecutor(max_workers=JIT_MINT_CONCURRENCY, thread_name_prefix="mint")


def _none_if_zero(value: timedelta) -> timedelta | None:
    return value if value and value.total_seconds() > 0 else None


def scheduler_settings() -> SchedulerSettings:
    return SchedulerSettings(
        provision_timeout=registry.get("scheduler.provision_timeout"),
        failed_retention=registry.get("scheduler.failed_retention"),
        start_backoff=registry.get("scheduler.start_backoff"),
        max_start_backoff=registry.get("scheduler.max_start_backoff"),
        max_runner_lifetime=_none_if_zero(registry.get("scheduler.max_runner_lifetime")),
        default_idle_timeout=_none_if_zero(registry.get("scheduler.idle_timeout")),
        surplus_idle_timeout=_none_if_zero(registry.get("scheduler.surplus_idle_timeout")),
        unlinked_exit_grace=registry.get("scheduler.unlinked_exit_grace"),
    )


STARTING = (RunnerState.PROVISIONING, RunnerState.REGISTERING)


def _deregister(runner: Runner, now: datetime) -> str:
    """Delete an idle runner's registration at GitHub; "deleted", "gone", "busy" or why not."""
    if runner.github_runner_id is None or runner.installation_id is None:
        # A runner we hold no GitHub id for (a registration-token runner): nothing to ask.
        return "gone"
    app = get_app()
    if app is None:
        return "no GitHub App is configured"
    installation = runner.installation
    if under_standdown(installation, now):
        return f"installation {installation.account} is rate limited"
    try:
        return app.for_installation(installation.github_id).delete_runner(
            runner_id=runner.github_runner_id, **registration_target(runner.pool, installation)
        )
    except RateLimited as exc:
        stand_down(installation, exc, now=now, by="reconcile")
        return "rate limited by GitHub"
    except Exception as exc:  # the drain waits for the next pass; the runner stays idle
        return f"GitHub did not confirm the deregistration: {exc}"


def _withdraw(app, minted: _Minted, now: datetime) -> str:
    """Deregister a minted runner whose row could not be written; says what became of it.

    No agent task will ever start it, so it would sit at GitHub as a runner that runs no job
    until the reap (`github.reap_interval`) found it. Left to the reap when a row has it after
    all (a commit that failed late may have gone through) or when that cannot be read.
    """
    try:
        if Runner.objects.filter(name=minted.name).exists():
            return "a runner row has it after all"
    except DatabaseError:
        return "its registration is left to the reap"
    installation = minted.installation
    if minted.github_runner_id is None or under_standdown(installation, now):
        return "its registration is left to the reap"
    try:
        answer = app.for_installation(installation.github_id).delete_runner(
            runner_id=minted.github_runner_id, **registration_target(minted.pool, installation)
        )
    except RateLimited as exc:
        try:
            stand_down(installation, exc, now=now, by="reconcile")
        except DatabaseError:
            pass  # the next call to GitHub meets the limit and records it
        return "its registration is left to the reap (rate limited by GitHub)"
    except Exception as exc:
        return f"its registration is left to the reap ({exc})"
    log.info("%s: deregistered %s, whose row could not be written (%s)",
             minted.pool.name, minted.name, answer)  # fmt: skip
    return f"its registration was deleted at GitHub ({answer})"


def _seen_state(r: Runner) -> str:
    """The state the scheduler plans with: an idle runner GitHub has never shown online is
    still starting (issue 29 item 1), so the provision timeout applies to it and no idle
    drain counts it as a runner that could take a job."""
    if r.state == RunnerState.IDLE and r.online_at is None:
        return RunnerState.REGISTERING
    return r.state


def _runner_view(r: Runner, *, unlinked_exit: bool = False) -> RunnerView:
    return RunnerView(
        id=r.pk,
        pool_id=r.pool_id,
        host_id=r.host_id,
        state=_seen_state(r),
        created_at=r.created_at,
        state_changed_at=r.state_changed_at,
        finished_at=r.finished_at,
        cpus=r.cpus,
        memory_mb=r.memory_mb,
        dind=r.pool.dind,
        unlinked_exit=unlinked_exit,
        installation_id=r.installation_id,
        came_online=r.online_at is not None,
        lent_mb=r.lent_memory_mb,
    )


def _allocatable(host: Host) -> tuple[float | None, int | None]:
    """BACK-07: the host's machine less its reserve (fleet.agent.backends.resources), the
    same figures the agent divides into slot shares; a figure not reported stays None."""
    both = allocatable(host.cpus or 0.0, host.memory_mb or 0)
    return (
        both.cpus if host.cpus is not None else None,
        both.memory_mb if host.memory_mb is not None else None,
    )


def build_snapshot(now: datetime, wait_reasons: dict[int, str] | None = None) -> Snapshot:
    """The rows, the settings and `now`, as plain data (SCHED-02). `wait_reasons`, when
    given, is filled with each queued job's stored wait reason, read with the job, so the
    pass writes only the reasons that changed without reading every queued row again."""
    # A pool the scheduler cannot read is skipped, not fatal; runners.problems names it.
    pools, _unreadable = read_pools(Pool.objects.order_by("name"))
    hosts = tuple(
        HostView(
            id=h.pk,
            name=h.name,
            healthy=h.health == HostHealth.HEALTHY,
            cordoned=h.cordoned,
            backends=tuple(h.backends or ()),
            platform=h.platform or None,
            labels=tuple(sorted((str(k), str(v)) for k, v in (h.labels or {}).items())),
            # HOST-14, HOST-18: the slots its throttle leaves.
            capacity=capacity_of(h),
            # BACK-07: the machine less its reserve, the same figures the agent divides.
            cpus=_allocatable(h)[0],
            memory_mb=_allocatable(h)[1],
            # HOST-13: a fresh sample acutely short of CPU or memory holds new starts.
            hold_reason=hold_of(h, now),
            pressure_hold=bool(hold_of(h, now)),
        )
        for h in Host.objects.order_by("pk")
    )
    settings = scheduler_settings()
    runners = tuple(
        _runner_view(r)
        for r in Runner.objects.exclude(state=RunnerState.REMOVED).select_related("pool")
    ) + tuple(
        _runner_view(r, unlinked_exit=True)
        for r in unlinked_exits(now, settings.unlinked_exit_grace).select_related("pool")
    )
    # Five columns, not model instances: a burst leaves thousands of queued jobs, and every
    # pass reads them all (the instances were a quarter of a pass's time at 16,000).
    queued = Job.objects.filter(status=JobStatus.QUEUED).order_by("created_at", "pk")
    rows = list(
        queued.values_list(
            "pk", "labels", "repository", "installation_id", "created_at", "wait_reason"
        )
    )
    jobs = tuple(
        JobView(
            id=pk,
            labels=tuple(labels or ()),
            repository=repository,
            installation_id=installation_id,
            created_at=created_at,
        )
        for pk, labels, repository, installation_id, created_at, _reason in rows
    )
    if wait_reasons is not None:
        wait_reasons.update((row[0], row[5]) for row in rows)
    return Snapshot(
        now=now,
        pools=pools,
        hosts=hosts,
        runners=runners,
        queued_jobs=jobs,
        settings=settings,
    )


@dataclass
class ApplyReport:
    """What a pass did, one sentence per action (for logs and the audit trail)."""

    created: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    demand: list[str] = field(default_factory=list)

    def changed(self) -> bool:
        return bool(self.created or self.failed or self.drained)


def runner_command(pool: Pool, image: str) -> list[str] | None:
    """The argv a process-backend runner runs; container backends run the image instead.

    A process runner runs as the agent's user on the host, so its image names one of the
    programs in `runners.github.programs`, never an arbitrary command (ValueError).
    """
    if pool.backend != Pool.Backend.PROCESS:
        return None
    return process_program(image).command(registry.get("runners.actions_runner_dir"))


class InstallationChooser:
    """Which installation each new runner registers in.

    A runner registered in one organisation can take only that organisation's jobs, so a
    pool serving several installations registers each runner where its pool's queued jobs
    come from, skipping installations under a rate-limit stand-down (POLL-05: one
    installation out of quota must not stop the others scaling).
    """

    def __init__(self, snapshot: Snapshot | None, now: datetime):
        self.now = now
        self.installations = {i.pk: i for i in Installation.objects.filter(active=True)}
        self.remaining: dict[int, list[int]] = {}
        if snapshot is None:
            return
        available = Counter(
            Runner.objects.filter(
                state__in=[RunnerState.PROVISIONING, RunnerState.REGISTERING, RunnerState.IDLE]
            ).values_list("pool_id", "installation_id")
        )
        for pool_id, jobs in assign_jobs(snapshot.queued_jobs, snapshot.pools).items():
            wanted = Counter(j.installation_id for j in jobs if j.installation_id)
            for (runner_pool, inst_id), count in available.items():
                if runner_pool == pool_id and inst_id in wanted:
                    wanted[inst_id] -= count
            ordered = sorted(jobs, key=lambda j: (j.created_at, j.id))
            queue = []
            for job in ordered:
                if job.installation_id and wanted[job.installation_id] > 0:
                    wanted[job.installation_id] -= 1
                    queue.append(job.installation_id)
            self.remaining[pool_id] = queue

    def _usable(self, installation: Installation | None) -> bool:
        return (
            installation is not None
            and not under_standdown(installation, self.now)
            and not _minting_held(installation, self.now)
        )

    def choose(self, pool: Pool) -> tuple[Installation | None, str]:
        """An installation, or None and the reason there is none."""
        if pool.installation_id:
            inst = self.installations.get(pool.installation_id)
            if inst is None:
                return None, f"{pool.name}: its installation is inactive"
            if not self._usable(inst):
                return None, self._standdown_reason(pool, inst)
            return inst, ""
        queue = self.remaining.get(pool.pk, [])
        limited = None
        for index, inst_id in enumerate(queue):
            inst = self.installations.get(inst_id)
            if self._usable(inst):
                del queue[index]
                return inst, ""
            limited = limited or inst
        if limited is not None:
            return None, self._standdown_reason(pool, limited)
        # Warm runners, or jobs credited to no installation: any usable installation.
        for inst in sorted(self.installations.values(), key=lambda i: i.pk):
            if self._usable(inst):
                return inst, ""
        return None, f"{pool.name}: no GitHub installation to register runners in"

    def _standdown_reason(self, pool: Pool, inst: Installation) -> str:
        if _minting_held(inst, self.now):
            return (
                f"{pool.name}: minting for installation {inst.account} failed "
                f"{inst.mint_failures} time(s) ({inst.mint_error}); next try at "
                f"{inst.mint_retry_at:%H:%M:%S}"
            )
        # The stand-down belongs to the installation: minting spends the same quota.
        return (
            f"{pool.name}: installation {inst.account} is rate limited until "
            f"{inst.standdown_until:%H:%M:%S}"
        )


def _minting_held(installation: Installation, now: datetime) -> bool:
    """Issue 21 item 5: after failed mints the installation's next try waits its backoff."""
    return installation.mint_retry_at is not None and now < installation.mint_retry_at


@dataclass
class _Minted:
    create: object
    pool: Pool
    installation: Installation
    name: str
    env: dict
    github_runner_id: int | None


def _mint(app, create, pool: Pool, installation: Installation, image: str) -> _Minted:
    """Ask GitHub for the runner's credential: a JIT config, or a registration token.

    Runs in a worker thread: it touches no database, only the objects it was handed.
    """
    name = naming.runner_name(pool.name, secrets.randbelow(10**6), secrets.token_hex(3))
    client = app.for_installation(installation.github_id)
    target = registration_target(pool, installation)
    labels = runner_labels(pool.labels, pool.name, pool.platform)
    if pool.ephemeral:
        jit = client.generate_jitconfig(
            name=name, labels=labels, runner_group_id=pool.runner_group_id, **target
        )
        env = {"ACTIONS_RUNNER_INPUT_JITCONFIG": jit.encoded_jit_config}
        return _Minted(create, pool, installation, name, env, jit.runner_id)
    # SCHED-15: a registration token for config.sh, which the runner's entrypoint runs once
    # with the web URL of where it registers (on GHES the host, never its /api/v3).
    token, _expires = client.registration_token(**target)
    where = target.get("repo") or target["org"]
    env = {
        RUNNER_URL_ENV: f"{web_base(app.base_url)}/{where}",
        RUNNER_TOKEN_ENV: token,
        RUNNER_NAME_ENV: name,
        RUNNER_LABELS_ENV: ",".join(labels),
    }
    # Its registration id is learnt from GitHub's list by name once it is online.
    return _Minted(create, pool, installation, name, env, None)


# What docker/runner/zoomies-entrypoint.sh (and the fake runner) give config.sh.
RUNNER_URL_ENV = "ZOOMIES_RUNNER_URL"
RUNNER_TOKEN_ENV = "ZOOMIES_RUNNER_TOKEN"  # noqa: S105  # a variable's name, not a secret
RUNNER_NAME_ENV = "ZOOMIES_RUNNER_NAME"
RUNNER_LABELS_ENV = "ZOOMIES_RUNNER_LABELS"


DOCKER_WAIT_ENV = "ZOOMIES_DOCKER_WAIT"  # read by docker/runner/zoomies-entrypoint.sh


def runner_env(pool: Pool) -> dict[str, str]:
    """What the operator gives a pool's runners (BACK-11, BACK-12): runners.env, then for a
    pool that provides Docker runners.docker_wait as ZOOMIES_DOCKER_WAIT, then the pool's
    own env over both, key by key. The minted credential goes on top of this, never under.
    """
    env = dict(item.partition("=")[::2] for item in registry.get("runners.env"))
    if pool.dind:
        # A "Docker pool" is one whose runners get a daemon: only they run the image's wait.
        env[DOCKER_WAIT_ENV] = str(int(registry.get("runners.docker_wait").total_seconds()))
    env.update({str(k): str(v) for k, v in (pool.env or {}).items()})
    return env


def _new_runner(minted: _Minted, image: str, limits: Collection[str] = ()) -> NewRunner:
    """The create action's input: the pool's command for `image`, the operator's env, the
    minted credential, and of what it was charged what its host's engine can apply
    (`limits`, BACK-05)."""
    pool, create = minted.pool, minted.create
    env = {**runner_env(pool), **minted.env}
    if pool.backend == Pool.Backend.PROCESS:
        env.update(process_program(image).environment(str(django_settings.BASE_DIR)))
    return NewRunner(
        name=minted.name,
        pool=pool,
        host_id=create.host_id,
        installation=minted.installation,
        image=image,
        cpus=given(pool.cpus, create.cpus, "cpus" in limits),
        memory_mb=given(pool.memory_mb, create.memory_mb, "memory" in limits),
        github_runner_id=minted.github_runner_id,
        env=env,
        command=runner_command(pool, image),
        reason=create.reason,
        placement=getattr(create, "placement", ""),
    )


def apply_plan(plan: Plan, now: datetime, snapshot: Snapshot | None = None) -> ApplyReport:
    report = ApplyReport()
    for fail in plan.fails:
        runner = Runner.objects.filter(pk=fail.runner_id).first()
        if runner is None:
            continue
        # Only a runner still starting is failed by the provision timeout: one that came
        # online since the snapshot was taken is left alone. Idle by its process's word
        # alone is still starting (issue 29 item 1); the online check runs in this same
        # pass, under the same lease, so it cannot stamp the runner between here and there.
        starting = STARTING if runner.online_at else (*STARTING, RunnerState.IDLE)
        reason = fail.reason
        if runner.state in (RunnerState.REGISTERING, RunnerState.IDLE):
            started = "process was running" if runner.phase == "running" else "workload started"
            reason += (
                f"; its {started} but GitHub never showed its registration online "
                "(can the runner reach GitHub?)"
            )
        failed = fail_runner(runner, now=now, actor=ACTOR, message=reason, expected_from=starting)
        if failed.changed:
            report.failed.append(reason)
    for drain in plan.drains:
        runner = Runner.objects.filter(pk=drain.runner_id).first()
        if runner is None or runner.state != RunnerState.IDLE:
            continue
        if runner.drain_deferred_until is not None and now < runner.drain_deferred_until:
            continue  # GitHub said it is busy: wait for its job's end or the reap interval
        # Deregister at GitHub first, never destroy a workload on a stale "idle": a runner that
        # took a job meanwhile answers "busy" (422), and nothing touches a busy runner.
        answer = _deregister(runner, now)
        if answer == "busy":
            # Issue 8 item 7: not asked again on every pass; the reap interval is when the
            # registrations are looked at again anyway.
            until = now + registry.get("github.reap_interval")
            why = f"GitHub says it is running a job; asked again at {until:%H:%M:%S}"
            defer_idle_drain(runner, until=until, now=now, actor=ACTOR, reason=why)
            report.skipped.append(f"{runner.name}: not drained: {why} unless the job ends first")
            continue
        if answer != "deleted" and answer != "gone":
            report.skipped.append(f"{runner.name}: not drained: {answer}")
            continue
        if drain_runner(
            runner,
            now=now,
            actor=ACTOR,
            reason=drain.reason,
            expected_from=[RunnerState.IDLE],
            # Only "deleted" proves the registration was there and took no job ("gone" may
            # be an ephemeral runner GitHub removed after a job we have not heard of).
            deregistered_at=now if answer == "deleted" else None,
        ).changed:
            report.drained.append(drain.reason)
    report.demand.extend(d.reason for d in plan.demand)

    pools = {p.pk: p for p in Pool.objects.filter(pk__in={c.pool_id for c in plan.creates})}
    work = []
    chooser = InstallationChooser(snapshot, now) if plan.creates else None
    for create in plan.creates:
        pool = pools.get(create.pool_id)
        if pool is None:
            continue
        try:
            runner_command(pool, create.image)
        except ValueError as exc:
            report.skipped.append(f"{pool.name}: {exc}")
            continue
        installation, why_not = chooser.choose(pool)
        if installation is None:
            report.skipped.append(why_not)
            continue
        work.append((create, pool, installation, create.image))
    if not work:
        return report
    app = get_app()
    if app is None:
        report.skipped.append("no GitHub App is configured: no runner can be registered")
        return report
    # BACK-05: per host and backend, the limits its engine said it can apply.
    limits = dict(
        Host.objects.filter(pk__in={w[0].host_id for w in work}).values_list("pk", "backend_limits")
    )
    # A burst scales up in one pass: mint concurrently, within a bounded number of
    # connections, and write the runners as their credentials come back: the first at
    # once, then whatever came back meanwhile, together in one transaction (issue 28). One
    # slow mint delays only itself.
    host_ids: set[int] = set()
    order = {}
    for index, w in enumerate(work):
        order[_mint_threads.submit(_mint, app, *w)] = index
    waiting = set(order)
    while waiting:
        done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
        ready = []
        for future in sorted(done, key=order.__getitem__):
            create, pool, inst, image = work[order[future]]
            try:
                minted = future.result()
            except RateLimited as exc:
                until = stand_down(inst, exc, now=now, by="reconcile")
                report.skipped.append(f"{pool.name}: rate limited by GitHub until {until:%H:%M:%S}")
                continue
            except Exception as exc:  # a refused mint skips this create; a later pass retries
                report.skipped.append(f"{pool.name}: could not mint a runner credential: {exc}")
                # Once per change, not per try (issue 21 item 5): the problems list says it.
                if note_mint_failure(inst, error=str(exc), now=now):
                    log.warning("%s: could not mint a runner credential: %s", pool.name, exc)
                continue
            if note_mint_success(inst):
                log.warning("installation %s: minting works again", inst.account)
            can = (limits.get(create.host_id) or {}).get(pool.backend) or ()
            ready.append((create, minted, _new_runner(minted, image, can)))
        for create, runner in _write_runners(app, ready, now, report):
            host_ids.add(create.host_id)
            report.created.append(f"{runner.name}: {create.reason}")
    _notify_hosts(host_ids)
    return report


def _write_runners(
    app, ready: list[tuple[CreateRunner, _Minted, NewRunner]], now: datetime, report: ApplyReport
) -> list[tuple[CreateRunner, Runner]]:
    """The runners whose credentials came back together, in one transaction; if that fails,
    each on its own, so one bad row does not lose the rest of the burst (its credential is
    withdrawn at GitHub)."""
    if len(ready) > 1:
        try:
            runners = create_runners([new for _, _, new in ready], now=now, actor=ACTOR)
            return [(c, runner) for (c, _, _), runner in zip(ready, runners, strict=True)]
        except Exception:
            log.warning("a group of %d runner rows failed: writing each alone", len(ready))
    written = []
    for create, minted, new in ready:
        try:
            written.append((create, create_runner(new, now=now, actor=ACTOR)))
        except Exception as exc:  # one bad row must not lose the rest of the burst
            log.exception("%s: could not write the runner row", new.pool.name)
            withdrawn = _withdraw(app, minted, now)  # outside the failed transaction
            report.skipped.append(
                f"{new.pool.name}: could not write the runner row: {exc}; {withdrawn}"
            )
    return written


def _notify_hosts(host_ids: set[int]) -> None:
    for host_id in host_ids:
        notify_host(host_id)
    if host_ids:
        announce_pending_tasks()  # the long-polls are in the web process, not this worker


def reconcile_once(now: datetime) -> ApplyReport:
    """One decide-and-apply, without the lease (callers hold it)."""
    with metrics.RECONCILE_SECONDS.time():
        app = get_app()
        # Issue 29 item 1: GitHub's word on which new runners are online, before deciding.
        checked = check_online(now, app) if app is not None else []
        stored_reasons: dict[int, str] = {}
        snapshot = build_snapshot(now, wait_reasons=stored_reasons)
        plan = decide(snapshot)
        report = apply_plan(plan, now, snapshot)
        # Issue 8 item 2: why each queued job still has no runner, where the API shows it.
        reasons = job_wait_reasons(snapshot, plan, report.skipped)
        record_wait_reasons(reasons, now, stored=stored_reasons)
        # Issue 29 item 4: a failed runner's registration goes now (this pass's fails too).
        deregistered = deregister_failed(now, app) if app is not None else []
    for line in checked + report.created + report.failed + report.drained + report.skipped:
        log.info("reconcile: %s", line)
    for line in deregistered:
        log.info("reconcile: %s", line)
    return report


def holder_name() -> str:
    """Unique per pass, so two threads of one process do not share the lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def reconcile_now(
    now_fn=timezone.now, max_rounds: int = 5, *, woken: bool = False
) -> list[ApplyReport] | None:
    """Run passes under the reconcile lease; None when another holder has it (SCHED-27).

    A wake that arrives while a pass runs marks the lease dirty, and the holder runs once
    more, so wakes coalesce and none is lost. `woken`: the caller is the task a wake
    enqueued; its flag is cleared in the lease's own transaction, before the pass reads
    anything, so a wake from then on enqueues the next task (runners.wake).
    """
    holder = holder_name()
    # Marked before trying: a holder that lets go between our try and our mark would
    # otherwise miss this wake. A successful acquire clears the mark. Both in one
    # transaction, and below the release and the renewal in one: each lease write alone
    # was a wait for SQLite's write lock of its own, half a burst's reconcile time (issue 28).
    with transaction.atomic():
        if woken:
            clear_wake()  # one write transaction a woken pass, not two (the single job's path)
        leases.mark_dirty(LEASE_NAME)
        if not leases.acquire(LEASE_NAME, holder=holder, now=now_fn(), ttl=LEASE_TTL):
            return None
    reports = []
    try:
        for round_number in range(1, max_rounds + 1):
            reports.append(reconcile_once(now_fn()))
            if round_number == max_rounds:
                break
            with transaction.atomic():
                if leases.release(LEASE_NAME, holder=holder):
                    return reports
                leases.renew(LEASE_NAME, holder=holder, now=now_fn(), ttl=LEASE_TTL)
    except BaseException:
        leases.release(LEASE_NAME, holder=holder, force=True)
        raise
    if not leases.release(LEASE_NAME, holder=holder, force=True):
        # Still woken after max_rounds: hand the rest to a fresh pass rather than drop it.
        wake_reconcile()
    return reports
