"""The scheduler's input (a snapshot) and output (a plan): plain, frozen, hashable data.

The reconcile pass builds a `Snapshot` from rows, the clock and the settings, hands it to
`decide`, and applies the `Plan`. Nothing here knows about Django (SCHED-01, SCHED-02).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

# Runner states as the scheduler reads them (runners.states.RunnerState has the same
# values; it cannot be imported here because it is a Django TextChoices).
PROVISIONING = "provisioning"
REGISTERING = "registering"
IDLE = "idle"
BUSY = "busy"
DRAINING = "draining"
FAILED = "failed"
REMOVED = "removed"

TERMINAL_STATES = frozenset({FAILED, REMOVED})
# A runner in one of these can still take a queued job, so it answers demand.
AVAILABLE_STATES = frozenset({PROVISIONING, REGISTERING, IDLE})
# The provision timeout covers both halves of a start (SCHED-17).
STARTING_STATES = frozenset({PROVISIONING, REGISTERING})


@dataclass(frozen=True)
class SchedulerSettings:
    """The scheduler's tunables (scheduler.* settings), with the spec's defaults."""

    provision_timeout: timedelta = timedelta(minutes=20)
    failed_retention: timedelta = timedelta(minutes=10)
    start_backoff: timedelta = timedelta(seconds=10)
    max_start_backoff: timedelta = timedelta(minutes=5)
    max_runner_lifetime: timedelta | None = None  # None: unlimited.
    default_idle_timeout: timedelta | None = None  # For pools that set none; None: never.
    # An idle runner beyond its pool's warm count and queued jobs is drained after this
    # long whatever the idle timeout says (issue 21 item 18: runners made for jobs GitHub
    # had already finished stayed idle for good); None: never.
    surplus_idle_timeout: timedelta | None = timedelta(minutes=10)
    # How long an ephemeral runner that ended cleanly, with no job heard of, still stands
    # for the job it must have run: GitHub's word on that job may lag (webhooks reordered
    # or lost until the next poll), and without it the job would look queued and get a
    # second runner.
    unlinked_exit_grace: timedelta = timedelta(minutes=1)


@dataclass(frozen=True)
class PoolView:
    """A pool as the scheduler sees it.

    `platform` is e.g. "linux/x64"; None (or "") means any. `host_selector` holds the
    key=value labels a host must carry. `image` "" means the catalogue image.
    `installation_id` None means the pool takes jobs from any installation.
    """

    id: int
    name: str
    labels: tuple[str, ...]
    backend: str
    platform: str | None
    host_selector: tuple[tuple[str, str], ...]
    image: str
    cpus: float | None
    memory_mb: int | None
    dind: bool = False
    ephemeral: bool = True
    warm: int = 0
    max_runners: int = 10
    paused: bool = False
    idle_timeout: timedelta | None = None
    installation_id: int | None = None


@dataclass(frozen=True)
class HostView:
    """A host: its health, what it offers, and its size.

    `capacity` is the number of runner slots (the effective capacity, after any throttle).
    `cpus`/`memory_mb` are the allocatable machine, None when not reported; a host with
    neither is limited by its slots alone. `pressure_hold` is set while a fresh sample says
    CPU or memory is acutely short.
    """

    id: int
    name: str
    healthy: bool
    cordoned: bool
    backends: tuple[str, ...]
    platform: str | None
    labels: tuple[tuple[str, str], ...]
    capacity: int
    cpus: float | None
    memory_mb: int | None
    pressure_hold: bool = False
    hold_reason: str = ""  # what the sample that holds it showed


@dataclass(frozen=True)
class RunnerView:
    """A runner row.

    `state_changed_at` is when it entered its current state (the idle clock for an idle
    runner). `cpus`/`memory_mb` are what it was charged at create: the total for the
    runner, both containers together for a dind pair (exactly `CreateRunner.cpus` /
    `CreateRunner.memory_mb`). None means unknown, and the pool's rule is applied instead.
    """

    id: int
    pool_id: int
    host_id: int | None
    state: str
    created_at: datetime
    state_changed_at: datetime
    finished_at: datetime | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    dind: bool = False
    # A removed ephemeral runner that exited 0 without any job being linked to it.
    unlinked_exit: bool = False
    # Where it is registered; None when not yet known (a row written before its mint).
    installation_id: int | None = None
    # GitHub showed it online, or it took a job: if it fails now, its start did not.
    came_online: bool = False
    # HOST-29: memory its host's valve lent it above `memory_mb`, charged with it.
    lent_mb: int = 0


@dataclass(frozen=True)
class JobView:
    """A queued job: its runs-on labels and where it came from."""

    id: int
    labels: tuple[str, ...]
    repository: str
    installation_id: int | None
    created_at: datetime


@dataclass(frozen=True)
class Snapshot:
    """Everything a decision depends on, `now` included (SCHED-02)."""

    now: datetime
    pools: tuple[PoolView, ...]
    hosts: tuple[HostView, ...]
    runners: tuple[RunnerView, ...]
    queued_jobs: tuple[JobView, ...]
    settings: SchedulerSettings = SchedulerSettings()


@dataclass(frozen=True)
class CreateRunner:
    """Create one runner of `pool_id` on `host_id`.

    `cpus`/`memory_mb` are what the runner is charged: the pool's figure (twice it for a
    dind pair) or one slot's share of the host; None where neither applies (the host has
    not reported that figure and the pool typed none). Write them on the runner row so the
    next snapshot charges the same. For a dind pair each container's limit is half of
    each figure: the typed figure each, or half a slot share each.
    `placement` says why this host, for the Runners page.
    """

    pool_id: int
    host_id: int
    image: str
    cpus: float | None
    memory_mb: int | None
    reason: str
    placement: str = ""


@dataclass(frozen=True)
class FailRunner:
    """Fail a runner that did not come online in time."""

    runner_id: int
    reason: str


@dataclass(frozen=True)
class DrainRunner:
    """Drain an idle runner (idle timeout or maximum lifetime)."""

    runner_id: int
    reason: str


@dataclass(frozen=True)
class ScaleFromZero:
    """Demand no host in the fleet could ever run: `count` runners, and what is missing."""

    pool_id: int
    count: int
    missing: str
    reason: str


@dataclass(frozen=True)
class PoolWait:
    """The pool's start backoff is in force until `until`: no creates for it before then."""

    pool_id: int
    until: datetime
    reason: str


@dataclass(frozen=True)
class PoolBlocked:
    """Demand that waits for no action of ours: a paused pool, its cap, or no room.

    Informational, for the Pools page and the problems list; `actions()` leaves it out
    because there is nothing to apply.
    """

    pool_id: int
    count: int
    reason: str


@dataclass(frozen=True)
class Plan:
    """What to do, each action with an operator-readable reason (SCHED-03)."""

    creates: tuple[CreateRunner, ...] = ()
    fails: tuple[FailRunner, ...] = ()
    drains: tuple[DrainRunner, ...] = ()
    demand: tuple[ScaleFromZero, ...] = ()
    waits: tuple[PoolWait, ...] = ()
    blocked: tuple[PoolBlocked, ...] = field(default=())

    def actions(
        self,
    ) -> tuple[CreateRunner | FailRunner | DrainRunner | ScaleFromZero | PoolWait, ...]:
        """Every action, each with `.reason`: fails, drains, creates, demand, waits."""
        return (*self.fails, *self.drains, *self.creates, *self.demand, *self.waits)

    def is_empty(self) -> bool:
        """True when there is nothing to apply."""
        return not self.actions()
