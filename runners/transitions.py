"""The one place a runner's state is written (RUN-05).

Every change is a compare-and-set UPDATE guarded by the allow-list in `runners.states`: a
count of 0 means another writer won or the edge is illegal, and nothing is forced.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Coalesce

from accounts import audit
from runners.models import Runner
from runners.states import (
    REVIVAL_EDGE,
    TERMINAL_STATES,
    RunnerState,
    can_transition,
    sources_of,
)
from zoomies_site.core.events import emit, emit_each

log = logging.getLogger("zoomies.runners")


@dataclass(frozen=True)
class TransitionResult:
    """What a transition did: `changed` only when this call moved the row."""

    changed: bool
    previous: str | None
    current: str | None
    dropped: bool = False  # an illegal edge that was refused


def transition_runner(
    runner_id: int,
    new_state: str,
    *,
    now: datetime,
    actor: str,
    reason: str = "",
    message: str | None = None,
    extra: dict[str, Any] | None = None,
    expected_from: Iterable[str] | None = None,
) -> TransitionResult:
    """Move a runner to `new_state` if the allow-list permits it from its current state.

    `expected_from` narrows the move to the states the caller decided on: a plan made from
    a snapshot says "drain this idle runner", and a runner that turned busy since must not
    be drained by it (nothing the scheduler decides touches a busy runner, SCHED-20).

    A repeated state changes nothing, not even `state_changed_at` (the idle clock, RUN-07).
    `finished_at` is stamped once, on the first terminal entry (RUN-09), `failed_at` on the
    first failure and `online_at` on the first job (issue 29 item 1). `message` is kept
    when given (a failure's reason is the only record of why it failed).
    """
    new_state = RunnerState(new_state)
    with transaction.atomic():
        row = Runner.objects.filter(pk=runner_id).values_list("state", "ephemeral").first()
        if row is None:
            return TransitionResult(False, None, None)
        current, ephemeral = row
        if current == new_state:
            return TransitionResult(False, current, current)
        if expected_from is not None and current not in set(expected_from):
            log.info(
                "runner %s: not moved to %s: it is %s now, not %s (%s)",
                runner_id,
                new_state,
                current,
                "/".join(sorted(expected_from)),
                reason or actor,
            )
            return TransitionResult(False, current, current)
        if not _allowed(current, new_state, ephemeral=ephemeral):
            # A runner that has already ended (removed, failed) being asked to move again is
            # an expected race (a drain decided a moment before the exit was reported): a
            # debug line. Any other illegal edge is a bug worth a warning (issue 21 item 21:
            # `removed -> draining` was 69 warnings in one burst of 200).
            level = logging.DEBUG if current in TERMINAL_STATES else logging.WARNING
            log.log(
                level,
                "runner %s: dropped illegal transition %s -> %s (%s)",
                runner_id,
                current,
                new_state,
                reason or actor,
            )
            return TransitionResult(False, current, current, dropped=True)
        # The guard repeats the allow-list in SQL: a concurrent writer that moved the row
        # since the read above makes this count 0 instead of forcing an edge.
        moved = Runner.objects.filter(
            pk=runner_id, state=current, state__in=sources_of(new_state)
        ).update(state=new_state, **_move_fields(new_state, now, message, extra))
        if not moved:
            latest = Runner.objects.filter(pk=runner_id).values_list("state", flat=True).first()
            return TransitionResult(False, current, latest)
        _record_move(runner_id, current, new_state, now=now, actor=actor, reason=reason)
    return TransitionResult(True, current, new_state)


def _allowed(current: str, new_state: str, *, ephemeral: bool) -> bool:
    """The allow-list's word on a move, and RUN-04: an ephemeral runner's one job is its
    last; it never goes back to idle."""
    reuse = ephemeral and (current, new_state) == (RunnerState.BUSY, RunnerState.IDLE)
    return not reuse and can_transition(current, new_state)


def _move_fields(
    new_state: str, now: datetime, message: str | None, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """What a move writes beside the state itself (which its writers name, so the
    one-writer scan sees them)."""
    fields: dict[str, Any] = {"state_changed_at": now, **(extra or {})}
    if message is not None:
        fields["message"] = message
    if new_state in TERMINAL_STATES:
        fields["finished_at"] = Coalesce("finished_at", Value(now))
    if new_state == RunnerState.FAILED:
        fields["failed_at"] = Coalesce("failed_at", Value(now))
    if new_state == RunnerState.BUSY:
        # GitHub gave it a job: it is online, whatever the online check last saw.
        fields["online_at"] = Coalesce("online_at", Value(now))
    return fields


class MoveLost(Exception):
    """A move of `transition_read_runners` found its row changed since the caller read it."""


@dataclass(frozen=True)
class RunnerMove:
    """One move of `transition_read_runners`: `runner` as read, locked, in this transaction."""

    runner: Runner
    new_state: str
    now: datetime
    reason: str
    # The state it is in when not the one read: the caller moved it in this transaction
    # (runners/actions/reports.py: provisioning -> registering, then on to idle).
    moved_to: str | None = None

    @property
    def current(self) -> str:
        return self.moved_to if self.moved_to is not None else self.runner.state


def transition_read_runners(moves: Sequence[RunnerMove], *, actor: str) -> None:
    """Move runners the caller read and locked in its transaction, a group at once: what
    `transition_runner` does for each, without reading each row again and with one INSERT
    for all their audit rows and one for their events (a burst of webhooks,
    runners.actions.jobs.apply_job_moves_together).

    Each move must be legal from the state read (ValueError otherwise: the caller chose
    wrongly) and is still a compare-and-set on it; one that finds its row moved meanwhile
    raises MoveLost, and the caller's savepoint takes the whole group back.
    """
    for move in moves:
        runner, new_state = move.runner, RunnerState(move.new_state)
        current = move.current
        if current == new_state or not _allowed(current, new_state, ephemeral=runner.ephemeral):
            raise ValueError(f"runner {runner.pk}: {current} -> {new_state} is not a move")
        moved = Runner.objects.filter(
            pk=runner.pk, state=current, state__in=sources_of(new_state)
        ).update(state=new_state, **_move_fields(new_state, move.now, None, None))
        if not moved:
            raise MoveLost(f"runner {runner.pk} is no longer {current}")
    audit.record_each(
        [
            (actor, f"runner.{m.new_state}", Runner(pk=m.runner.pk),
             {"from": m.current, "to": str(RunnerState(m.new_state)), "reason": m.reason},
             m.now)
            for m in moves
        ]
    )  # fmt: skip
    emit_each([(f"runner.{m.new_state}", Runner(pk=m.runner.pk), m.now) for m in moves])


def revive_runner(
    runner_id: int,
    *,
    failed_message_prefix: str,
    now: datetime,
    actor: str,
    reason: str,
    message: str = "",
) -> TransitionResult:
    """Failed -> busy, only for a runner whose failure message starts with
    `failed_message_prefix` (issue 21 item 20: "host h1 lost: ", the one failure a returning
    host can prove wrong). `REVIVAL_EDGE` is off the allow-list, so `transition_runner` can
    never take it; this compare-and-set is guarded on the state and the message together, so
    a runner failed again since for any other reason stays failed.

    The failure's marks go with it: `finished_at` and `failed_at` (the pool's failed-start
    count must not count a runner that ran its job), and the message is replaced.
    """
    current, new_state = REVIVAL_EDGE
    with transaction.atomic():
        moved = Runner.objects.filter(
            pk=runner_id, state=current, message__startswith=failed_message_prefix
        ).update(
            state=new_state,
            state_changed_at=now,
            message=message,
            finished_at=None,
            failed_at=None,
            online_at=Coalesce("online_at", Value(now)),
        )
        if not moved:
            latest = Runner.objects.filter(pk=runner_id).values_list("state", flat=True).first()
            return TransitionResult(False, latest, latest)
        _record_move(runner_id, current, new_state, now=now, actor=actor, reason=reason)
    return TransitionResult(True, current, new_state)


def _record_move(
    runner_id: int, current: str, new_state: str, *, now: datetime, actor: str, reason: str
) -> None:
    """A move's audit row and event, in the moving transaction (both edges write them)."""
    audit.record(
        actor=actor,
        action=f"runner.{new_state}",
        target=Runner(pk=runner_id),
        detail={"from": current, "to": new_state, "reason": reason},
        at=now,
    )
    emit(f"runner.{new_state}", Runner(pk=runner_id), at=now)
