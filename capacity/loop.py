"""The capacity loop: `step(now)` looks once, records what to publish, and dispatches tries.

A step: recover tries whose sender vanished, run the spawn backstop (joins adopted every
step, its sweep at most once a minute across controllers, ESC-14), build the snapshot,
plan, apply the plan's clock moves and start its attempts (each one durable row before any
request), then hand every due try to `dispatch` (a django-q2 task by default, so a
delivery runs in a worker outside any transaction, CAP-18). Tests pass `now` and an inline
dispatch; nothing here reads the clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from capacity import actions, backstop
from capacity.claims import SpawnRefused, start_claimed_scale_up
from capacity.config import CapacityConfig
from capacity.config import load as load_config
from capacity.models import Attempt, AttemptState
from capacity.planner import CapacityPlan, plan
from capacity.snapshot import build

log = logging.getLogger("zoomies.capacity")


@dataclass
class StepReport:
    started: list[int] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    recovered: list[int] = field(default_factory=list)
    dispatched: list[int] = field(default_factory=list)
    teardowns: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    plan: CapacityPlan | None = None


def enqueue_delivery(attempt_id: int) -> None:
    from django_q.tasks import async_task  # noqa: PLC0415  # django-q2's models need the apps loaded

    async_task(
        "capacity.tasks.deliver_task",
        attempt_id,
        group="capacity_delivery",
        q_options={"timeout": 120},
    )


def step(
    now: datetime,
    *,
    dispatch: Callable[[int], object] | None = None,
    config: CapacityConfig | None = None,
    run_backstop: bool = True,
) -> StepReport:
    """One step. `run_backstop=False` stands the spawn backstop down (ESC-19): no provision is
    timed out or torn down while another controller may be acting on the same ones."""
    config = config or load_config()
    dispatch = dispatch or enqueue_delivery
    report = StepReport()
    report.recovered = actions.recover_stale(now=now, backoff=config.retry_backoff)
    if config.enabled:
        # The backstop first: a provision that timed out this pass arms its deferral, and
        # one that joined clears it, before the planner decides whether to ask for another
        # (ESC-22, ESC-23).
        if run_backstop:
            report.teardowns = backstop.run(now, config=config)
        snapshot = build(now, config)
        decided = plan(snapshot)
        report.plan = decided
        for move in decided.clocks:
            actions.apply_clock(move)
        for emit in decided.emits:
            try:
                attempt = start_scale_event(emit, config=config, now=now)
            except SpawnRefused as refused:
                report.refused.append(f"{emit.reading.pool_name}: {refused}")
                log.warning(
                    "capacity: scale-up for %s refused: %s", emit.reading.pool_name, refused
                )
                continue
            report.started.append(attempt.pk)
            log.info("capacity: %s %s: %s", emit.type, attempt.event_id, emit.reason)
        report.held = [h.reason for h in decided.held]
    due = Attempt.objects.filter(state=AttemptState.PENDING, next_try_at__lte=now).order_by(
        "next_try_at", "pk"
    )
    for attempt_id in due.values_list("pk", flat=True):
        dispatch(attempt_id)
        report.dispatched.append(attempt_id)
    return report


def start_scale_event(emit, *, config: CapacityConfig, now: datetime) -> Attempt:
    """Start the attempt for a planned event; a scale-up may carry a claim code (ESC-01)."""
    if emit.type == "capacity_demand" and config.claim_codes:
        return start_claimed_scale_up(emit, config=config, now=now)
    return actions.start_emit(emit, destination_url=config.destination_url, now=now)
