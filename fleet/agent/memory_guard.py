"""The agent's memory guard: the valve (memory_valve.py) run on its own thread, apart from
lifecycle work, over the containers this agent tracks, their use read by the sampler
(sampling.py: four at once, 5 s each, 20 s a pass). The controller's rules arrive with each
heartbeat answer; what was lent and what was refused go back with the next heartbeat."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from fleet.agent.backends.base import Backend
from fleet.agent.host import meminfo
from fleet.agent.memory_valve import MemoryUse, MemoryValve
from fleet.agent.sampling import RunnerSampler
from fleet.protocol import MemoryRules

log = logging.getLogger("zoomies.agent")

MB = 1024 * 1024
IDLE_LOOK = 5.0  # with nothing due, how long the guard sleeps before looking again


def host_free_mb() -> int | None:
    """The host's available memory now (/proc/meminfo), re-read before each raise."""
    info = meminfo()
    return info["MemAvailable"] // MB if "MemAvailable" in info else None


class MemoryGuard:
    def __init__(
        self,
        backends: dict[str, Backend],
        *,
        clock: Callable[[], float],
        free_mb: Callable[[], int | None] = host_free_mb,
    ) -> None:
        self.backends = backends
        self.clock = clock
        self.free_mb = free_mb
        self.valve = MemoryValve()
        self._counted_mb = 0  # what the last heartbeat reported lent (the controller counts it)
        self._backend_of: dict[int, str] = {}
        self.sampler: RunnerSampler[MemoryUse] = RunnerSampler(self._read, clock=clock)

    def use(self, rules: MemoryRules | None) -> None:
        """The rules from a heartbeat answer. None (the valve off here, or no runner of this
        host has a limit) stops lending; an answer that never came keeps the last (HOST-30)."""
        if rules is None:
            self.valve.rules = None
            return
        self.valve.observe = rules.observe
        # An observing valve's loans are never charged: it counts them all itself.
        self.valve.use_rules(rules, counted_mb=0 if rules.observe else self._counted_mb)

    def report(self) -> dict[str, Any]:
        """What the next heartbeat carries: loans and refusals, keyed by runner id."""
        body: dict[str, Any] = {}
        loans = self.valve.loans()
        self._counted_mb = 0 if self.valve.observe else sum(loans.values())
        if loans:
            # HOST-31: an observing valve's loans were never made: kept apart, not charged.
            key = "memory_would_lend" if self.valve.observe else "memory_loans"
            body[key] = {str(k): v for k, v in loans.items()}
        if blocked := self.valve.blocked():
            body["memory_blocked"] = {str(k): v for k, v in blocked.items()}
        return body

    def step(self, runners: Iterable[tuple[int, str]]) -> float:
        """One look at the runners (id, backend) that are due; answers how long until the
        next is. Nothing happens without rules."""
        if self.valve.rules is None:
            return IDLE_LOOK
        self._backend_of = {rid: name for rid, name in runners}
        now = self.clock()
        due = [rid for rid in self._backend_of if self.valve.due_at(rid) <= now]
        samples = self.sampler.sample(due)
        fresh = {rid: s.value for rid, s in samples.items() if s.fresh}
        # A due runner whose sample failed stays due: it is asked again next look.
        lines = self.valve.step(now, self._backend_of, fresh.get, self._raise, self.free_mb)
        for line in lines:
            log.info("memory valve: %s", line)
        next_due = self.valve.next_due()
        return IDLE_LOOK if next_due is None else max(0.2, min(IDLE_LOOK, next_due - now))

    def _read(self, runner_id: int) -> MemoryUse | None:
        backend = self.backends.get(self._backend_of.get(runner_id, ""))
        return None if backend is None else backend.memory_use(runner_id)

    def _raise(self, runner_id: int, limit_mb: int) -> None:
        backend = self.backends.get(self._backend_of.get(runner_id, ""))
        if backend is not None:
            backend.raise_memory(runner_id, limit_mb)

    def close(self) -> None:
        self.sampler.close()
