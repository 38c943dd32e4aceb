"""The one door from the fleet to the runners app: what happens to runners when a host's
facts change is the runners app's to decide (issue 22 item 1).

The fleet floor reports facts (a host joined again, went silent, came back, was drained, an
agent's task failed, its inventory and reports); it never imports `runners`, which stands
above it. The runners app hands its answers in at start (`RunnersConfig.ready`), and every
call below goes to that module, inside whatever transaction the caller holds. Nothing here
keeps state but the registration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fleet import protocol
    from fleet.memory_planner import RunnerMemory
    from fleet.models import AgentTask, Host


class RunnerSide(Protocol):
    """What the runners app answers for; `runners/host_facts.py` is the one implementation."""

    # The runner states that hold a slot on their host (all but removed and failed).
    LIVE_STATES: frozenset[str]

    def fail_live_runners(
        self, host: Host, *, now: datetime, actor: str, message: str, job_failure: str
    ) -> list[str]: ...

    def host_joined(self, host: Host, *, now: datetime) -> None: ...

    def host_lost(self, host: Host, *, now: datetime, actor: str, why: str) -> list[str]: ...

    def host_back_from_lost(self, host: Host, *, now: datetime, actor: str) -> list[str]: ...

    def drain_host_runners(
        self, host: Host, *, now: datetime, actor: str, reason: str
    ) -> list[str]: ...

    def task_failed(self, task: AgentTask, *, error: str, now: datetime, actor: str) -> None: ...

    def tasks_abandoned(self, tasks: Iterable[AgentTask], *, now: datetime) -> list[str]: ...

    def adopted_after_loss(
        self, host: Host, *, runner_ids: Iterable[int], now: datetime, actor: str
    ) -> list[str]: ...

    def memory_of_runners(self, host: Host) -> Sequence[RunnerMemory]: ...

    def queued_start_memory(self, host: Host) -> int: ...

    def record_memory_loans(
        self, host: Host, loans: Mapping[int, int], *, observed: bool = False
    ) -> int: ...

    def record_memory_blocked(
        self, host: Host, blocked: Mapping[int, str], *, now: datetime
    ) -> int: ...

    def apply_reports(
        self, *, host: Host, reports: Any, now: datetime
    ) -> tuple[list[int], list[int]]: ...

    def expected_runners(self, host: Host, now: datetime) -> Sequence[protocol.ExpectedRunner]: ...


_side: list[RunnerSide] = []


def register(side: RunnerSide) -> None:
    """Called once by the runners app at start; a second registration replaces the first."""
    _side[:] = [side]


def runner_side() -> RunnerSide:
    if not _side:
        raise RuntimeError("the runners app has not registered its side (is it installed?)")
    return _side[0]
