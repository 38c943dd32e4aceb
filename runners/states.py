"""The runner state machine and the job lifecycle order, as the spec draws them.

`RUNNER_TRANSITIONS` is the one allow-list; `runners.transitions.transition_runner` is the
one place that enforces it.
"""

from __future__ import annotations

from django.db import models


class RunnerState(models.TextChoices):
    PROVISIONING = "provisioning"
    REGISTERING = "registering"
    IDLE = "idle"
    BUSY = "busy"
    DRAINING = "draining"
    FAILED = "failed"
    REMOVED = "removed"


S = RunnerState
TERMINAL_STATES = frozenset({S.FAILED, S.REMOVED})
LIVE_STATES = frozenset(set(S) - TERMINAL_STATES)

# RUN-02: the drawn edges.
DRAWN_EDGES = frozenset(
    {
        (S.PROVISIONING, S.REGISTERING),
        (S.REGISTERING, S.IDLE),
        (S.REGISTERING, S.BUSY),
        (S.IDLE, S.BUSY),
        (S.BUSY, S.IDLE),
        (S.IDLE, S.DRAINING),
        (S.BUSY, S.DRAINING),
        (S.PROVISIONING, S.DRAINING),
        (S.REGISTERING, S.DRAINING),
        (S.PROVISIONING, S.FAILED),
        (S.REGISTERING, S.FAILED),
        (S.DRAINING, S.REMOVED),
        (S.FAILED, S.REMOVED),
    }
)
# RUN-03: every live state may also go straight to failed or removed (a vanished host).
RUNNER_TRANSITIONS = DRAWN_EDGES | {
    (live, end) for live in LIVE_STATES for end in (S.FAILED, S.REMOVED)
}


# Issue 21 item 20: the one way back from failed, off the list on purpose. A runner failed
# only because its host was judged lost, whose returning agent shows it ran on with a job,
# is busy again; no other failure is undone, and only `transitions.revive_runner` takes it.
REVIVAL_EDGE = (S.FAILED, S.BUSY)


def can_transition(current: str, new: str) -> bool:
    """A repeated state is legal (RUN-07); otherwise the edge must be on the list."""
    return current == new or (current, new) in RUNNER_TRANSITIONS


def sources_of(new: str) -> list[str]:
    """States from which `new` may be entered (excluding `new` itself)."""
    return sorted(src for (src, dst) in RUNNER_TRANSITIONS if dst == new)


class JobStatus(models.TextChoices):
    WAITING = "waiting"
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


# HOOK-03: a job only moves forward. waiting and queued share a rank: GitHub sends
# queued, waiting, queued for an environment-gated job, with
# identical timestamps, so they cannot order the two.
JOB_RANK = {
    JobStatus.WAITING: 0,
    JobStatus.QUEUED: 0,
    JobStatus.IN_PROGRESS: 1,
    JobStatus.COMPLETED: 2,
}


def job_statuses_before(new: str) -> list[str]:
    """The statuses a job may be moved to `new` from."""
    rank = JOB_RANK[new]
    return [s for s, r in JOB_RANK.items() if r < rank or (r == rank == 0 and s != new)]
