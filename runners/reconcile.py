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
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings as django_settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from fleet.models import Host
from fleet.states import HostHealth, TaskKind
from fleet.taskqueue import enqueue_task
from runners import naming
from runners.github.errors import RateLimited
from runners.lifecycle import drain_runner, fail_runner
from runners.models import Installation, Job, Pool, Runner
from runners.poller import stand_down, under_standdown
from runners.scheduler import (
    HostView,
    JobView,
    Plan,
    PoolView,
    RunnerView,
    SchedulerSettings,
    Snapshot,
    assign_jobs,
    decide,
)
from runners.states import JobStatus, RunnerState
from zoomies_site import leases, registry

log = logging.getLogger("zoomies.reconcile")

LEASE_NAME = "reconcile"
LEASE_TTL = timedelta(minutes=5)  # longer than any pass; a crashed holder frees it by expiry
ACTOR = "system:reconcile"
FAKE_RUNNER_IMAGE = "zoomies/fake-runner"
JIT_MINT_CONCURRENCY = 8


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
        unlinked_exit_grace=registry.get("scheduler.unlinked_exit_grace"),
    )


STARTING = (RunnerState.PROVISIONING, RunnerState.REGISTERING)


def registration_target(pool: Pool, installation: Installation) -> dict[str, str]:
    """Where a pool's runners register at GitHub: its repository, or the organisation."""
    if pool.repository:
        return {"repo": pool.repository}
    if installation.kind == Installation.Kind.REPO:
        if not installation.repositories:
            raise RuntimeError(f"installation {installation.account} lists no repository")
        return {"repo": installation.repositories[0]}
    return {"org": installation.account}


def _deregister(runner: Runner, now: datetime) -> str:
    """Delete an idle runner's registration at GitHub; "deleted", "gone", "busy" or why not."""
    if runner.github_runner_id is None or runner.installation_id is None:
        # A runner we hold no GitHub id for (a registration-token runner): nothing to ask.
        return "gone"
    from runners.github.config import get_app

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


def _runner_view(r: Runner, *, unlinked_exit: bool = False) -> RunnerView:
    return RunnerView(
        id=r.pk,
        pool_id=r.pool_id,
        host_id=r.host_id,
        state=r.state,
        created_at=r.created_at,
        state_changed_at=r.state_changed_at,
        finished_at=r.finished_at,
        cpus=r.cpus,
        memory_mb=r.memory_mb,
        dind=r.pool.dind,
        unlinked_exit=unlinked_exit,
    )


def unlinked_exits(now: datetime, grace: timedelta):
    """Ephemeral runners that ended cleanly within `grace` with no job linked to them.

    An ephemeral runner exits 0 after its one job, so such a runner ran a job we have not
    heard of yet; the scheduler lets it stand for that job for the grace.
    """
    linked = Job.objects.filter(runner_id=OuterRef("pk"))
    named = Job.objects.filter(runner_name=OuterRef("name"))
    return (
        Runner.objects.filter(
            state=RunnerState.REMOVED,
            ephemeral=True,
            exit_code=0,
            finished_at__gt=now - grace,
        )
        .exclude(Exists(linked))
        .exclude(Exists(named))
    )


def build_snapshot(now: datetime) -> Snapshot:
    """The rows, the settings and `now`, as plain data (SCHED-02)."""
    pools = tuple(
        PoolView(
            id=p.pk,
            name=p.name,
            labels=tuple(p.labels or ()),
            backend=p.backend,
            platform=p.platform or None,
            host_selector=tuple(sorted((str(k), str(v)) for k, v in p.host_selector.items())),
            image=p.image,
            cpus=p.cpus,
            memory_mb=p.memory_mb,
            dind=p.dind,
            ephemeral=p.ephemeral,
            warm=p.warm,
            max_runners=p.max_runners,
            paused=p.paused,
            idle_timeout=p.idle_timeout,
            installation_id=p.installation_id,
        )
        for p in Pool.objects.order_by("name")
    )
    hosts = tuple(
        HostView(
            id=h.pk,
            name=h.name,
            healthy=h.health == HostHealth.HEALTHY,
            cordoned=h.cordoned,
            backends=tuple(h.backends or ()),
            platform=h.platform or None,
            labels=tuple(sorted((str(k), str(v)) for k, v in (h.labels or {}).items())),
            capacity=h.capacity,
            cpus=h.cpus,
            memory_mb=h.memory_mb,
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
    jobs = tuple(
        JobView(
            id=j.pk,
            labels=tuple(j.labels or ()),
            repository=j.repository,
            installation_id=j.installation_id,
            created_at=j.created_at,
        )
        for j in Job.objects.filter(status=JobStatus.QUEUED).order_by("created_at", "pk")
    )
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


PROCESS_IMAGES = (naming.PROCESS_RUNNER, FAKE_RUNNER_IMAGE)


def runner_command(pool: Pool, image: str) -> list[str] | None:
    """The argv a process-backend runner runs; container backends run the image instead.

    A process runner runs as the agent's user on the host, so only the two programs this
    codebase knows are allowed: the actions runner unpacked on the host, and the fake
    runner. A pool's image is never run as an arbitrary command.
    """
    if pool.backend != Pool.Backend.PROCESS:
        return None
    if image == FAKE_RUNNER_IMAGE:
        return [sys.executable, "-m", "runners.github.fake.runner"]
    if image == naming.PROCESS_RUNNER:
        root = os.environ.get("ZOOMIES_ACTIONS_RUNNER_DIR", "/opt/actions-runner")
        return [os.path.join(root, "run.sh")]
    raise ValueError(f"the process backend runs only {' or '.join(PROCESS_IMAGES)}, not {image!r}")


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
        return installation is not None and not under_standdown(installation, self.now)

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

    @staticmethod
    def _standdown_reason(pool: Pool, inst: Installation) -> str:
        # The stand-down belongs to the installation: minting spends the same quota.
        return (
            f"{pool.name}: installation {inst.account} is rate limited until "
            f"{inst.standdown_until:%H:%M:%S}"
        )


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
    labels = list(dict.fromkeys(list(pool.labels or []) + [pool.name]))
    if pool.ephemeral:
        jit = client.generate_jitconfig(
            name=name, labels=labels, runner_group_id=pool.runner_group_id, **target
        )
        env = {"ACTIONS_RUNNER_INPUT_JITCONFIG": jit.encoded_jit_config}
        return _Minted(create, pool, installation, name, env, jit.runner_id)
    # SCHED-15: a non-ephemeral runner runs config.sh with a registration token.
    token, _expires = client.registration_token(**target)
    url_base = app.base_url.replace("api.github.com", "github.com")
    env = {
        "ZOOMIES_RUNNER_REGISTRATION_TOKEN": token,
        "ZOOMIES_RUNNER_URL": f"{url_base}/{target.get('org') or target.get('repo')}",
        "ZOOMIES_RUNNER_NAME": name,
        "ZOOMIES_RUNNER_LABELS": ",".join(labels),
    }
    return _Minted(create, pool, installation, name, env, None)


def _write_runner(minted: _Minted, image: str, now: datetime) -> Runner:
    """The provisioning row and its create task, in one transaction (SCHED-16)."""
    pool, create = minted.pool, minted.create
    with transaction.atomic():
        runner = Runner.objects.create(
            name=minted.name,
            pool=pool,
            host_id=create.host_id,
            installation=minted.installation,
            state=RunnerState.PROVISIONING,
            created_at=now,
            state_changed_at=now,
            github_runner_id=minted.github_runner_id,
            image=image,
            cpus=create.cpus,
            memory_mb=create.memory_mb,
            ephemeral=pool.ephemeral,
            message=create.reason,
        )
        env = dict(minted.env)
        if pool.backend == Pool.Backend.PROCESS and image == FAKE_RUNNER_IMAGE:
            # The fake runner is this codebase's module; a host agent runs it from here.
            env["PYTHONPATH"] = str(django_settings.BASE_DIR)
        enqueue_task(
            host_id=create.host_id,
            runner_id=runner.pk,
            kind=TaskKind.CREATE_RUNNER,
            payload={
                "runner_id": runner.pk,
                "runner_name": runner.name,
                "pool": pool.name,
                "backend": pool.backend,
                "image": image,
                "command": runner_command(pool, image),
                "env": env,
                "cpus": create.cpus,
                "memory_mb": create.memory_mb,
                "dind": pool.dind,
                "ephemeral": pool.ephemeral,
            },
            now=now,
        )
        from accounts import audit

        audit.record(
            actor=ACTOR,
            action="runner.provisioning",
            target=runner,
            detail={"reason": create.reason, "placement": getattr(create, "placement", "")},
            at=now,
        )
    return runner


def apply_plan(plan: Plan, now: datetime, snapshot: Snapshot | None = None) -> ApplyReport:
    report = ApplyReport()
    for fail in plan.fails:
        runner = Runner.objects.filter(pk=fail.runner_id).first()
        # Only a runner still starting is failed by the provision timeout: one that came
        # online since the snapshot was taken is left alone.
        if (
            runner
            and fail_runner(
                runner, now=now, actor=ACTOR, message=fail.reason, expected_from=STARTING
            ).changed
        ):
            report.failed.append(fail.reason)
    for drain in plan.drains:
        runner = Runner.objects.filter(pk=drain.runner_id).first()
        if runner is None or runner.state != RunnerState.IDLE:
            continue
        # PEERS 3: deregister at GitHub first. A runner that took a job meanwhile answers
        # "busy" (422), and nothing touches a busy runner.
        answer = _deregister(runner, now)
        if answer != "deleted" and answer != "gone":
            report.skipped.append(f"{runner.name}: not drained: {answer}")
            continue
        if drain_runner(
            runner, now=now, actor=ACTOR, reason=drain.reason, expected_from=[RunnerState.IDLE]
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
    from runners.github.config import get_app

    app = get_app()
    if app is None:
        report.skipped.append("no GitHub App is configured: no runner can be registered")
        return report
    # PEERS 7: mint a burst concurrently, within a bounded number of connections, and write
    # each runner as soon as its credential is back: one slow mint delays only itself.
    host_ids = set()
    with ThreadPoolExecutor(max_workers=min(JIT_MINT_CONCURRENCY, len(work))) as pool_exec:
        pending = {pool_exec.submit(_mint, app, *w): w for w in work}
        for future in as_completed(pending):
            create, pool, inst, image = pending[future]
            try:
                minted = future.result()
            except RateLimited as exc:
                until = stand_down(inst, exc, now=now, by="reconcile")
                report.skipped.append(f"{pool.name}: rate limited by GitHub until {until:%H:%M:%S}")
                continue
            except Exception as exc:  # a refused mint skips this create; the next pass retries
                report.skipped.append(f"{pool.name}: could not mint a runner credential: {exc}")
                log.warning("%s: could not mint a runner credential: %s", pool.name, exc)
                continue
            try:
                runner = _write_runner(minted, image, now)
            except Exception as exc:  # one bad row must not lose the rest of the burst
                log.exception("%s: could not write the runner row", pool.name)
                report.skipped.append(f"{pool.name}: could not write the runner row: {exc}")
                continue
            host_ids.add(create.host_id)
            report.created.append(f"{runner.name}: {create.reason}")
    _notify_hosts(host_ids)
    return report


def _notify_hosts(host_ids: set[int]) -> None:
    try:
        from fleet.wakeups import notify_host
    except ImportError:
        return
    for host_id in host_ids:
        notify_host(host_id)


def reconcile_once(now: datetime) -> ApplyReport:
    """One decide-and-apply, without the lease (callers hold it)."""
    snapshot = build_snapshot(now)
    plan = decide(snapshot)
    report = apply_plan(plan, now, snapshot)
    for line in report.created + report.failed + report.drained + report.skipped:
        log.info("reconcile: %s", line)
    return report


def holder_name() -> str:
    """Unique per pass, so two threads of one process do not share the lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def reconcile_now(now_fn=timezone.now, max_rounds: int = 5) -> list[ApplyReport] | None:
    """Run passes under the reconcile lease; None when another holder has it (SCHED-27).

    A wake that arrives while a pass runs marks the lease dirty, and the holder runs once
    more, so wakes coalesce and none is lost.
    """
    holder = holder_name()
    # Marked before trying: a holder that lets go between our try and our mark would
    # otherwise miss this wake. A successful acquire clears the mark.
    leases.mark_dirty(LEASE_NAME)
    if not leases.acquire(LEASE_NAME, holder=holder, now=now_fn(), ttl=LEASE_TTL):
        return None
    reports = []
    try:
        for round_number in range(1, max_rounds + 1):
            reports.append(reconcile_once(now_fn()))
            if round_number == max_rounds:
                break
            if leases.release(LEASE_NAME, holder=holder):
                return reports
            leases.renew(LEASE_NAME, holder=holder, now=now_fn(), ttl=LEASE_TTL)
    except BaseException:
        leases.release(LEASE_NAME, holder=holder, force=True)
        raise
    if not leases.release(LEASE_NAME, holder=holder, force=True):
        # Still woken after max_rounds: hand the rest to a fresh pass rather than drop it.
        from runners.wake import wake_reconcile

        wake_reconcile()
    return reports
