"""Host, join-token and agent-protocol actions: every fleet state change goes through here.

Each action is one transaction that changes its rows and writes its audit row. The agent
protocol views (fleet.api), the admin and the management commands call them; so do the
tests, with a chosen `now`.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from accounts import audit
from fleet.models import AgentTask, Host, JoinToken
from fleet.selectors import AGENT_TOKEN_PREFIX, JOIN_TOKEN_PREFIX, hash_secret
from fleet.states import HostHealth, TaskKind, TaskState
from fleet.taskqueue import blank_env
from runners.actions import link_job_runner
from runners.lifecycle import fail_runner
from runners.models import Job, Runner
from runners.states import LIVE_STATES, TERMINAL_STATES, JobStatus, RunnerState
from runners.transitions import transition_runner

log = logging.getLogger("zoomies.fleet")

REJOIN_MESSAGE = "the host joined again; its runners were dropped"
REJOIN_JOB_FAILURE = "its runner's host joined again"

# HOST-09: free space is rewritten only when it moved by more than the larger of these.
DISK_FREE_TOLERANCE_FRACTION = 0.05
DISK_FREE_TOLERANCE_FLOOR_MB = 256

HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_USAGE_KEYS = 32


class FleetError(Exception):
    """A request the fleet refuses; `status` is the HTTP status the API answers with."""

    status = 400


class InvalidRequest(FleetError):
    status = 400


class InvalidJoinToken(FleetError):
    status = 401


class TaskNotFound(FleetError):
    status = 404


class TaskNotInFlight(FleetError):
    status = 409


def agent_actor(host: Host | str) -> str:
    return f"agent:{host if isinstance(host, str) else host.name}"


# -- join tokens --------------------------------------------------------------------------


def create_join_token(
    *, now: datetime, actor: str, ttl: timedelta = timedelta(hours=1)
) -> tuple[JoinToken, str]:
    """Mint a single-use join token (AUTH-08); the secret is returned once, stored as sha256."""
    if ttl <= timedelta(0):
        raise InvalidRequest("a join token's lifetime must be positive")
    secret = JOIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = JoinToken.objects.create(
            token_hash=hash_secret(secret),
            prefix=secret[:12],
            created_at=now,
            expires_at=now + ttl,
            created_by=actor,
        )
        audit.record(
            actor=actor,
            action="join_token.create",
            target=token,
            detail={"prefix": token.prefix, "expires_at": token.expires_at.isoformat()},
            at=now,
        )
    return token, secret


# -- facts --------------------------------------------------------------------------------


def _number(value: Any, name: str, *, integer: bool = False) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a number")
    if value < 0:
        raise InvalidRequest(f"{name} must not be negative")
    return int(value) if integer else float(value)


def _string(value: Any, name: str, max_length: int) -> str:
    if not isinstance(value, str) or len(value) > max_length:
        raise InvalidRequest(f"{name} must be a string of at most {max_length} characters")
    return value


def clean_facts(facts: dict) -> dict:
    """What a join or heartbeat says about the host, checked; absent or null facts are left out.

    Usage is not here: a bad measurement is dropped on its own (`clean_usage`), it does not
    make the heartbeat fail.
    """
    if not isinstance(facts, dict):
        raise InvalidRequest("the body must be a JSON object")
    out: dict = {}
    if facts.get("capacity") is not None:
        out["capacity"] = _number(facts["capacity"], "capacity", integer=True)
    if facts.get("backends") is not None:
        backends = facts["backends"]
        if not isinstance(backends, list) or len(backends) > 16:
            raise InvalidRequest("backends must be a list of names")
        out["backends"] = [_string(b, "a backend", 32) for b in backends]
    if facts.get("platform") is not None:
        out["platform"] = _string(facts["platform"], "platform", 32)
    if facts.get("cpus") is not None:
        out["cpus"] = _number(facts["cpus"], "cpus")
    if facts.get("memory_mb") is not None:
        out["memory_mb"] = _number(facts["memory_mb"], "memory_mb", integer=True)
    if facts.get("labels") is not None:
        labels = facts["labels"]
        if not isinstance(labels, dict) or len(labels) > 64:
            raise InvalidRequest("labels must be an object of at most 64 names")
        for key, value in labels.items():
            _string(key, "a label name", 64)
            if not isinstance(value, str | int | float | bool):
                raise InvalidRequest(f"label {key} must be a string, number or boolean")
        out["labels"] = labels
    if facts.get("version") is not None:
        out["version"] = _string(facts["version"], "version", 64)
    for name in ("disk_total_mb", "disk_free_mb"):
        if facts.get(name) is not None:
            out[name] = _number(facts[name], name, integer=True)
    return out


def clean_usage(usage: Any) -> dict | None:
    """HOST-11: usage is an object of non-negative finite numbers; None if it is not."""
    if not isinstance(usage, dict) or not usage or len(usage) > MAX_USAGE_KEYS:
        return None
    cleaned = {}
    for key, value in usage.items():
        if not isinstance(key, str) or len(key) > 64:
            return None
        try:
            cleaned[key] = _number(value, key)
        except InvalidRequest:
            return None
    return cleaned


def disk_free_moved(old: int | None, new: int) -> bool:
    """HOST-09: True when free space moved by more than max(5 % of the stored figure, 256 MB)."""
    if old is None:
        return True
    tolerance = max(old * DISK_FREE_TOLERANCE_FRACTION, DISK_FREE_TOLERANCE_FLOOR_MB)
    return abs(new - old) > tolerance


def _disk_fields(current: Host | None, facts: dict) -> dict:
    """HOST-10: the size says a measurement happened; without one the disk figures stay."""
    total = facts.get("disk_total_mb")
    if total is None:
        return {}
    fields: dict = {}
    resized = current is None or current.disk_total_mb != total
    if resized:
        fields["disk_total_mb"] = total
    free = facts.get("disk_free_mb")
    if free is not None and (
        resized or disk_free_moved(current.disk_free_mb if current else None, free)
    ):
        fields["disk_free_mb"] = free
    return fields


PLAIN_FACTS = ("capacity", "backends", "platform", "cpus", "memory_mb", "labels", "version")


# -- join ---------------------------------------------------------------------------------


def join_host(*, join_token: str, name: str, facts: dict, now: datetime) -> tuple[Host, str]:
    """Exchange a join token for the host's own agent token (AUTH-08, HOST-06).

    The token is spent by a compare-and-set, so two joins racing with one token cannot both
    succeed. A host joining again under its name keeps its id and gets a new agent token (the
    old one stops working); every live runner recorded against it is failed.
    """
    if not isinstance(join_token, str) or not join_token:
        raise InvalidJoinToken("a join token is required")
    if not isinstance(name, str) or not HOST_NAME.match(name):
        raise InvalidRequest(
            "name must be 1-64 letters, digits, dots, dashes or underscores, "
            "starting with a letter or digit"
        )
    cleaned = clean_facts(facts)
    usage = clean_usage(facts.get("usage"))
    secret = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_hash = hash_secret(join_token)
    actor = agent_actor(name)
    with transaction.atomic():
        spent = JoinToken.objects.filter(
            token_hash=token_hash, used_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
        if not spent:
            raise InvalidJoinToken("the join token is unknown, expired or already used")
        host = Host.objects.select_for_update().filter(name=name).first()
        fields: dict = {
            **{k: cleaned[k] for k in PLAIN_FACTS if k in cleaned},
            **_disk_fields(host, cleaned),
            "agent_token_hash": hash_secret(secret),
            "agent_token_prefix": secret[:12],
            "joined_at": now,
            "health": HostHealth.HEALTHY,
        }
        if usage is not None:
            fields.update(usage=usage, usage_at=now)
        rejoined = host is not None
        if host is None:
            try:
                with transaction.atomic():
                    host = Host.objects.create(name=name, health_changed_at=now, **fields)
            except IntegrityError:
                # Another join created this name a moment ago: this one is a rejoin.
                host = Host.objects.select_for_update().get(name=name)
                rejoined = True
        if rejoined:
            if host.health != HostHealth.HEALTHY:
                fields["health_changed_at"] = now
            Host.objects.filter(pk=host.pk).update(**fields)
            host.refresh_from_db()
        JoinToken.objects.filter(token_hash=token_hash).update(host=host)
        audit.record(
            actor=actor,
            action="host.rejoin" if rejoined else "host.join",
            target=host,
            detail={"token_prefix": host.agent_token_prefix, "facts": cleaned},
            at=now,
        )
        if rejoined:
            _drop_runners(host, now=now, actor=actor)
    return host, secret


def _drop_runners(host: Host, *, now: datetime, actor: str) -> list[str]:
    """HOST-06: the old registration's runners and the creates and stops queued for them go."""
    # Removes stay queued: a workload the old registration left behind should still go.
    AgentTask.objects.filter(
        host=host,
        kind__in=[TaskKind.CREATE_RUNNER, TaskKind.STOP_RUNNER],
        state__in=[TaskState.PENDING, TaskState.IN_FLIGHT],
    ).update(state=TaskState.CANCELLED, finished_at=now, error="the host joined again")
    blank_env(host=host)
    return fail_live_runners(
        host, now=now, actor=actor, message=REJOIN_MESSAGE, job_failure=REJOIN_JOB_FAILURE
    )


def fail_live_runners(
    host: Host, *, now: datetime, actor: str, message: str, job_failure: str
) -> list[str]:
    """Fail every runner still live on `host`; a job one was running is the fleet's failure."""
    failed: list[Runner] = []
    for runner in Runner.objects.filter(host=host, state__in=list(LIVE_STATES)).order_by("pk"):
        if fail_runner(runner, now=now, actor=actor, message=message).changed:
            failed.append(runner)
    mark_jobs_fleet_failure(failed, reason=job_failure, now=now, actor=actor)
    return [f"runner {r.name} failed: {message}" for r in failed]


def mark_jobs_fleet_failure(
    runners: Iterable[Runner], *, reason: str, now: datetime, actor: str
) -> int:
    """HOST-04: a job still running on one of `runners` is marked as the fleet's failure."""
    runners = list(runners)
    if not runners:
        return 0
    jobs = list(
        Job.objects.filter(
            Q(runner__in=runners) | Q(runner_name__in=[r.name for r in runners]),
            fleet_failure="",
        ).exclude(status=JobStatus.COMPLETED)
    )
    for job in jobs:
        if Job.objects.filter(pk=job.pk, fleet_failure="").update(
            fleet_failure=reason, updated_at=now
        ):
            audit.record(
                actor=actor,
                action="job.fleet_failure",
                target=job,
                detail={"reason": reason, "runner": job.runner_name or job.runner_id},
                at=now,
            )
    return len(jobs)


# -- heartbeat ----------------------------------------------------------------------------


def heartbeat_answer(host: Host) -> dict:
    from zoomies_site import registry

    interval = registry.get("agent.heartbeat_interval")
    return {"heartbeat_interval": int(interval.total_seconds()), "cordoned": host.cordoned}


def record_heartbeat(*, host: Host, facts: dict, now: datetime) -> dict:
    """Record a heartbeat and what it reports; answer the interval to sleep (HOST-01).

    A host that was unhealthy or lost is healthy again. Free disk is rewritten only when it
    moved enough (HOST-09); without a disk size the disk figures stay (HOST-10). A usage
    sample that is not an object of non-negative numbers is dropped, not the heartbeat
    (HOST-11): a bad measurement must not make a host look dead.
    """
    cleaned = clean_facts(facts)
    raw_usage = facts.get("usage")
    usage = clean_usage(raw_usage)
    if raw_usage is not None and usage is None:
        log.warning("host %s: dropped an invalid usage sample %.200r", host.name, raw_usage)
    with transaction.atomic():
        current = Host.objects.select_for_update().get(pk=host.pk)
        fields: dict = {"last_heartbeat_at": now}
        for key in PLAIN_FACTS:
            if key in cleaned and getattr(current, key) != cleaned[key]:
                fields[key] = cleaned[key]
        fields.update(_disk_fields(current, cleaned))
        if usage is not None:
            fields.update(usage=usage, usage_at=now)
        recovered = current.health != HostHealth.HEALTHY
        if recovered:
            fields.update(health=HostHealth.HEALTHY, health_changed_at=now)
        Host.objects.filter(pk=current.pk, health=current.health).update(**fields)
        if recovered:
            audit.record(
                actor=agent_actor(current),
                action="host.healthy",
                target=current,
                detail={"from": current.health, "reason": "heartbeat received"},
                at=now,
            )
        for key, value in fields.items():
            setattr(current, key, value)
    return heartbeat_answer(current)


def set_host_cordon(*, host: Host, cordoned: bool, now: datetime, actor: str) -> bool:
    """Cordon or uncordon a host: a cordoned host gets no new runners. True if it changed."""
    with transaction.atomic():
        moved = Host.objects.filter(pk=host.pk, cordoned=not cordoned).update(cordoned=cordoned)
        if moved:
            audit.record(
                actor=actor,
                action="host.cordon" if cordoned else "host.uncordon",
                target=host,
                at=now,
            )
    return bool(moved)


# -- task results -------------------------------------------------------------------------


def record_task_result(
    *,
    host: Host,
    task_id: int,
    ok: bool,
    error: str | None,
    attempt: int | None,
    now: datetime,
    actor: str | None = None,
) -> AgentTask:
    """Close an in-flight task with the agent's answer (or the controller's, `actor`, for a
    task it could not deliver).

    TASK-14: another host's task is not found. A task not in flight, or in flight under a
    later attempt than the one answered, is a conflict (its lease ended and it was offered
    again, or it was cancelled). RUN-14: a failed create fails the runner with the agent's
    reason. TASK-05: a failed stop fails the runner too (which asks the host for a remove and
    frees the slot); a failed remove is issued again by housekeeping until the host confirms
    one (TASK-08, `fleet.taskqueue.reissue_owed_removes`).
    """
    actor = actor or agent_actor(host)
    error = (error or "").strip()
    with transaction.atomic():
        task = AgentTask.objects.filter(pk=task_id, host=host).select_related("runner").first()
        if task is None:
            raise TaskNotFound(f"task {task_id} is not a task of this host")
        in_flight = AgentTask.objects.filter(pk=task.pk, state=TaskState.IN_FLIGHT)
        if attempt is not None:
            in_flight = in_flight.filter(attempt=attempt)
        new_state = TaskState.DONE if ok else TaskState.FAILED
        if not in_flight.update(
            state=new_state, finished_at=now, lease_deadline=None, error="" if ok else error
        ):
            if task.state != TaskState.IN_FLIGHT:
                raise TaskNotInFlight(f"task {task_id} is {task.state}, not in flight")
            raise TaskNotInFlight(
                f"task {task_id} is in flight as attempt {task.attempt}, not {attempt}"
            )
        blank_env(pk=task.pk)  # the runner credential is spent (or never will be)
        audit.record(
            actor=actor,
            action=f"task.{new_state}",
            target=task,
            detail={"kind": task.kind, "attempt": task.attempt, "error": error},
            at=now,
        )
        if not ok and task.kind == TaskKind.CREATE_RUNNER and task.runner is not None:
            fail_runner(
                task.runner,
                now=now,
                actor=actor,
                message=error or "the agent could not start the runner",
            )
        elif not ok and task.kind == TaskKind.STOP_RUNNER and task.runner is not None:
            # Nothing else would end a runner its host could not stop (TASK-05).
            fail_runner(
                task.runner,
                now=now,
                actor=actor,
                message=(
                    f"the host could not stop the runner: {error}"
                    if error
                    else "the host could not stop the runner"
                ),
                expected_from=LIVE_STATES,
            )
        task.refresh_from_db()
    return task


# -- runner reports -----------------------------------------------------------------------

REPORTED_STATES = {
    "registering": RunnerState.REGISTERING,
    "removed": RunnerState.REMOVED,
    "failed": RunnerState.FAILED,
}


def clean_reports(reports: Any) -> list[dict]:
    """The shape of a reports body; a malformed one is a 400, an unknown state a refusal."""
    if not isinstance(reports, list):
        raise InvalidRequest("reports must be a list")
    for report in reports:
        if not isinstance(report, dict):
            raise InvalidRequest("each report must be an object")
        runner_id = report.get("runner_id")
        if isinstance(runner_id, bool) or not isinstance(runner_id, int):
            raise InvalidRequest("each report needs an integer runner_id")
        for key in ("state", "phase", "message"):
            if report.get(key) is not None and not isinstance(report[key], str):
                raise InvalidRequest(f"a report's {key} must be a string or null")
        code = report.get("exit_code")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise InvalidRequest("a report's exit_code must be an integer or null")
    return reports


def apply_reports(*, host: Host, reports: list[dict], now: datetime) -> tuple[list[int], list[int]]:
    """Apply an agent's runner reports; returns (accepted, refused) runner ids.

    RUN-18: a report about a runner that is not on this host is refused. RUN-15: the agent
    asserts `registering`, then only phases, then `removed` or `failed`. RUN-16: a running
    phase makes a registering runner idle, never busy (only GitHub makes a runner busy). A
    report about a runner already ended is accepted and changes nothing but its phase and
    exit code, so the agent may clean up (AGENT-18).
    """
    accepted: list[int] = []
    refused: list[int] = []
    ended = False
    actor = agent_actor(host)
    for report in clean_reports(reports):
        runner_id = report["runner_id"]
        state = report.get("state")
        if state is not None and state not in REPORTED_STATES:
            refused.append(runner_id)
            continue
        with transaction.atomic():
            # Locked for the whole report, so a GitHub signal cannot slip in between the
            # read of `registering` and the move to idle (it would make busy -> idle).
            runner = Runner.objects.select_for_update().filter(pk=runner_id).first()
            if runner is None or runner.host_id != host.pk:
                refused.append(runner_id)
                continue
            _apply_report(runner, report, now=now, actor=actor)
        accepted.append(runner_id)
        if state in ("removed", "failed"):
            ended = True
    if ended:
        # A slot came free: the next pass should not wait for the ticker.
        from runners.wake import wake_reconcile

        wake_reconcile()
    return accepted, refused


def _catch_up_started_job(runner: Runner, *, now: datetime, actor: str) -> None:
    """RUN-16, HOOK-05: GitHub's in_progress can arrive while the runner is still
    provisioning, where busy is off the allow-list and the move was dropped; the job row kept
    it. Once the runner is registering or idle, that stored GitHub signal makes it busy
    (registering->busy and idle->busy are drawn edges), so a running job is never left on a
    runner the scheduler thinks is idle."""
    job = (
        Job.objects.filter(
            Q(runner_name=runner.name) | Q(runner=runner), status=JobStatus.IN_PROGRESS
        )
        .order_by("pk")
        .first()
    )
    if job is None:
        return
    if link_job_runner(job, now=now, actor=actor) is None and job.runner_id == runner.pk:
        # Linked by id but unnamed: link_job_runner finds runners by name only.
        transition_runner(
            runner.pk, RunnerState.BUSY, now=now, actor=actor, reason=f"job {job.github_id} started"
        )


def _apply_report(runner: Runner, report: dict, *, now: datetime, actor: str) -> None:
    state = report.get("state")
    phase = report.get("phase")
    exit_code = report.get("exit_code")
    message = (report.get("message") or "").strip()
    live = runner.state not in TERMINAL_STATES
    # Whether this report moved the runner to where GitHub's in_progress can land (below).
    came_online = False
    # `registering` moves only a row still provisioning: one drained meanwhile stays draining.
    if runner.state == RunnerState.PROVISIONING and state == "registering":
        came_online = transition_runner(
            runner.pk,
            RunnerState.REGISTERING,
            now=now,
            actor=actor,
            reason="the agent started the workload",
        ).changed
    elif live and state == "removed":
        transition_runner(
            runner.pk, RunnerState.REMOVED, now=now, actor=actor, reason="the workload exited"
        )
    elif live and state == "failed":
        if not message:
            message = (
                f"the runner exited with code {exit_code}"
                if exit_code is not None
                else "the agent reported the runner failed"
            )
        transition_runner(
            runner.pk,
            RunnerState.FAILED,
            now=now,
            actor=actor,
            reason="the workload failed",
            message=message,
        )
    if live and phase == "running":
        current = Runner.objects.filter(pk=runner.pk).values_list("state", flat=True).first()
        if current == RunnerState.REGISTERING:
            came_online |= transition_runner(
                runner.pk,
                RunnerState.IDLE,
                now=now,
                actor=actor,
                reason="the runner process is running",
            ).changed
    if came_online:
        _catch_up_started_job(runner, now=now, actor=actor)
    extra: dict = {}
    if phase is not None:
        extra["phase"] = phase[:32]
    if exit_code is not None:
        extra["exit_code"] = exit_code
    if extra:
        Runner.objects.filter(pk=runner.pk).update(**extra)
    if state in ("removed", "failed"):
        # The workload is gone: a create or stop still queued for it has nothing to act on.
        AgentTask.objects.filter(
            runner=runner,
            kind__in=[TaskKind.CREATE_RUNNER, TaskKind.STOP_RUNNER],
            state=TaskState.PENDING,
        ).update(state=TaskState.CANCELLED, finished_at=now, error=f"the runner was {state}")
        blank_env(runner=runner)
