"""Runner lifecycle actions that also involve the host: drain, fail, remove, reap."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction

from fleet.states import OPEN_TASK_STATES, TaskKind
from fleet.taskqueue import enqueue_task
from runners.models import Runner
from runners.states import RunnerState
from runners.transitions import TransitionResult, transition_runner


def _has_open_task(runner: Runner, kind: str) -> bool:
    return runner.tasks.filter(kind=kind, state__in=OPEN_TASK_STATES).exists()


def drain_runner(
    runner: Runner,
    *,
    now: datetime,
    actor: str,
    reason: str,
    expected_from: Iterable[str] | None = None,
) -> TransitionResult:
    """Tell a runner to stop taking work and exit; its host gets a stop task.

    A busy runner is given `runners.drain_grace` to finish its job before it is signalled
    (RUN-11); any other runner is signalled at once. Whether it was busy is read from the
    row the transition moved, never from the caller's copy.
    """
    from zoomies_site import registry

    with transaction.atomic():
        result = transition_runner(
            runner.pk,
            RunnerState.DRAINING,
            now=now,
            actor=actor,
            reason=reason,
            expected_from=expected_from,
        )
        if result.changed and runner.host_id and not _has_open_task(runner, TaskKind.STOP_RUNNER):
            was_busy = result.previous == RunnerState.BUSY
            grace = registry.get("runners.drain_grace") if was_busy else timedelta(0)
            enqueue_task(
                host_id=runner.host_id,
                runner_id=runner.pk,
                kind=TaskKind.STOP_RUNNER,
                payload={
                    "runner_id": runner.pk,
                    "grace": int(grace.total_seconds()),
                    "timeout": int(registry.get("agent.stop_margin").total_seconds()),
                },
                now=now,
            )
    return result


def fail_runner(
    runner: Runner,
    *,
    now: datetime,
    actor: str,
    message: str,
    reason: str = "",
    expected_from: Iterable[str] | None = None,
) -> TransitionResult:
    """Fail a runner with a sentence saying why; its host is asked to clean up the workload."""
    with transaction.atomic():
        result = transition_runner(
            runner.pk,
            RunnerState.FAILED,
            now=now,
            actor=actor,
            reason=reason or message,
            message=message,
            expected_from=expected_from,
        )
        if result.changed and runner.host_id and not _has_open_task(runner, TaskKind.REMOVE_RUNNER):
            # Cancel a create still waiting for the agent: it would start a doomed workload.
            runner.tasks.filter(kind=TaskKind.CREATE_RUNNER, state="pending").update(
                state="cancelled", finished_at=now
            )
            enqueue_task(
                host_id=runner.host_id,
                runner_id=runner.pk,
                kind=TaskKind.REMOVE_RUNNER,
                payload={"runner_id": runner.pk},
                now=now,
            )
    return result
