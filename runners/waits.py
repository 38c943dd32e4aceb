"""Why each queued job has no runner yet (issue 8 item 2).

A job whose labels match no pool, or whose pool is paused, capped, backing off or has no
host that could run it, used to wait with no sign anywhere. The plan already says why for
each pool; `job_wait_reasons` turns the plan (and what applying it skipped) into one
sentence per queued job, and `record_wait_reasons` keeps the latest on the job's row,
where the API and the admin show it and the problems list (runners.problems) names jobs
that have waited past `runners.job_wait_warning`.

The reconcile pass is the one writer of `Job.wait_reason`: an observation, like a host's
heartbeat time, so it is written without an audit row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from runners.models import Job
from runners.scheduler import Plan, Snapshot, assign_jobs
from runners.scheduler.model import AVAILABLE_STATES
from runners.states import JobStatus
from zoomies_site.core.events import emit_many

MAX_REASON = 500
_CHUNK = 500  # ids per UPDATE, well inside every database's limit on parameters


def _runs_on(labels: Sequence[str]) -> str:
    return "[" + ", ".join(labels) + "]"


def job_wait_reasons(snapshot: Snapshot, plan: Plan, skipped: Sequence[str] = ()) -> dict[int, str]:
    """Queued job id -> why it has no runner yet, from the plan for `snapshot`. Pure.

    `skipped` are the apply step's lines for creates it could not make (a pool's lines
    start with "<pool name>:"; a line naming no pool holds up every pool that had creates).
    """
    pools = {pool.id: pool for pool in snapshot.pools}
    by_pool = assign_jobs(snapshot.queued_jobs, snapshot.pools)
    notes: dict[int, list[str]] = {}
    # A backoff first: it holds every start of the pool, a cap only those beyond it.
    for item in (*plan.waits, *plan.blocked, *plan.demand):
        notes.setdefault(item.pool_id, []).append(item.reason)
    creating = {create.pool_id for create in plan.creates}
    pool_names = {pool.name for pool in snapshot.pools}
    for line in skipped:
        name = line.split(":", 1)[0]
        if name in pool_names:
            pool_ids = [p.id for p in snapshot.pools if p.name == name]
        else:
            pool_ids = sorted(creating)
        for pool_id in pool_ids:
            notes.setdefault(pool_id, []).append(line)
    available = {}
    for runner in snapshot.runners:
        if runner.state in AVAILABLE_STATES:
            available[runner.pool_id] = available.get(runner.pool_id, 0) + 1

    reasons: dict[int, str] = {}
    matched = set()
    for pool_id, jobs in by_pool.items():
        pool = pools[pool_id]
        said = notes.get(pool_id, [])
        if said:
            text = "; ".join(dict.fromkeys(said))
        elif pool_id in creating:
            text = f"a runner is being started in {pool.name}"
        elif available.get(pool_id):
            text = (
                f"{available[pool_id]} runner(s) of {pool.name} starting or idle; "
                "GitHub gives the job to one of them"
            )
        else:
            text = f"counted for {pool.name}, which has a runner for it"
        for job in jobs:
            matched.add(job.id)
            reasons[job.id] = text[:MAX_REASON]
    for job in snapshot.queued_jobs:
        if job.id not in matched:
            reasons[job.id] = (
                f"no pool matches runs-on {_runs_on(job.labels)} (a pool answers to its labels, "
                "self-hosted, and its platform's OS and arch; a pool bound to an installation "
                "takes only that installation's jobs)"
            )[:MAX_REASON]
    return reasons


def record_wait_reasons(
    reasons: Mapping[int, str], now: datetime, stored: Mapping[int, str] | None = None
) -> int:
    """Write each queued job's reason where it changed; returns how many rows changed.

    `stored` (the reasons the pass read with its snapshot) leaves out the jobs whose reason
    is already written; only the pass writes them, and the rest are checked against the
    table as before."""
    by_reason: dict[str, list[int]] = {}
    for job_id, reason in reasons.items():
        if stored is not None and stored.get(job_id) == reason:
            continue
        by_reason.setdefault(reason, []).append(job_id)
    changed = 0
    for reason, ids in by_reason.items():
        for start in range(0, len(ids), _CHUNK):
            stale = (
                Job.objects.filter(pk__in=ids[start : start + _CHUNK], status=JobStatus.QUEUED)
                .exclude(wait_reason=reason)
                .values_list("pk", flat=True)
            )
            moved = list(stale)
            if moved:
                changed += Job.objects.filter(pk__in=moved).update(
                    wait_reason=reason, wait_reason_at=now
                )
                emit_many("job.waiting", Job, moved, at=now)
    return changed
