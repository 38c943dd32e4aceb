"""The agent's half of the memory valve (HOST-26..28, HOST-30, HOST-31): raise a runner's
memory limit before the kernel kills its job, within the rules the controller sent.

A kernel about to kill a compiler does not wait for the next heartbeat, so the valve looks
at a container every second while it uses 70 % of its limit or climbs fast enough to reach
it within ten seconds, and every five seconds otherwise. A raise takes the limit to about a
third above the use (in 64 MB steps, at least 128 MB), never past the runner's ceiling, the
memory left to lend, or nine tenths of what the host has free right now (read again before
each raise). It only ever raises: lowering a live limit is what kills the job a loan was
meant to save. The last rules stand while the controller cannot be reached. In observe mode
the same decisions move a virtual limit and record what would have been lent; no container
changes.

`plan_raise` and `check_every` are pure; `MemoryValve.step` takes the clock and the reads
and the raise as parameters, so tests drive it on a moved clock or against a real engine.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fleet.protocol import MemoryRules, RunnerMemoryRule

log = logging.getLogger("zoomies.agent")

MEMORY_MARGIN = 1.3  # agent.MemoryMargin: a raise goes to a third above the use
MEMORY_STEP_MB = 64
MEMORY_MIN_RAISE_MB = 128
MEMORY_HOT_SHARE = 0.70  # at or above this share of its limit, a container is looked at often
MEMORY_SPILL_SHARE = 0.90  # a raise takes at most this share of the host's free memory
HOT_EVERY = 1.0
CALM_EVERY = 5.0
CLIMB_HORIZON = 10.0  # seconds: climbing to the limit within this is hot too


@dataclass(frozen=True)
class MemoryUse:
    """A container's memory as its engine reports it (use without reclaimable cache)."""

    used_mb: float
    limit_mb: int


@dataclass(frozen=True)
class RaiseDecision:
    """`limit_mb` the new limit, or None with `blocked` naming the rule that stopped a
    raise that was needed ("ceiling", "room", "no rule"); `reason` says it with figures."""

    limit_mb: int | None
    blocked: str
    reason: str


def check_every(use: MemoryUse, climb_mb_per_s: float) -> float:
    """HOST-26: one second while hot (70 % of the limit, or climbing to it within 10 s),
    five otherwise."""
    if use.limit_mb <= 0:
        return CALM_EVERY
    if use.used_mb >= MEMORY_HOT_SHARE * use.limit_mb:
        return HOT_EVERY
    if climb_mb_per_s > 0 and use.used_mb + climb_mb_per_s * CLIMB_HORIZON >= use.limit_mb:
        return HOT_EVERY
    return CALM_EVERY


def plan_raise(
    use: MemoryUse, rule: RunnerMemoryRule | None, lendable_mb: int, host_free_mb: int | None
) -> RaiseDecision | None:
    """HOST-27: None when the limit stands a third above the use already; else the raise
    the rules allow (whole 64 MB steps above the limit, at least 128 MB, or what is left up
    to the ceiling), or a blocked decision saying which rule stopped it."""
    wanted = use.used_mb * MEMORY_MARGIN
    if wanted <= use.limit_mb:
        return None
    if rule is None:
        return RaiseDecision(None, "no rule", "no rule for this runner from the controller yet")
    steps = math.ceil((wanted - use.limit_mb) / MEMORY_STEP_MB) * MEMORY_STEP_MB
    add = min(max(steps, MEMORY_MIN_RAISE_MB), rule.ceiling_mb - use.limit_mb)
    room = lendable_mb
    if host_free_mb is not None:
        room = min(room, int(host_free_mb * MEMORY_SPILL_SHARE))
    if add > room:
        add = max(0, room) - max(0, room) % MEMORY_STEP_MB
    if add <= 0:
        if use.limit_mb >= rule.ceiling_mb:
            return RaiseDecision(None, "ceiling", f"at its ceiling of {rule.ceiling_mb} MB")
        return RaiseDecision(None, "room", f"{max(0, room)} MB left to lend on this host")
    target = use.limit_mb + add
    return RaiseDecision(
        target,
        "",
        f"using {use.used_mb:.0f} of {use.limit_mb} MB: raised to {target} MB "
        f"(ceiling {rule.ceiling_mb}, {room} MB could be lent)",
    )


@dataclass
class _Watch:
    """What the valve knows of one runner between looks."""

    guarantee_mb: int
    limit_mb: int  # the real limit, or in observe mode the virtual one
    last_used_mb: float | None = None
    last_at: float | None = None
    due: float = 0.0
    blocked: str = ""  # the rule that stopped the last needed raise
    blocked_why: str = ""


@dataclass
class MemoryValve:
    observe: bool = False
    rules: MemoryRules | None = None
    _watches: dict[int, _Watch] = field(default_factory=dict)
    _lent_since_rules: int = 0

    def use_rules(self, rules: MemoryRules, *, counted_mb: int = 0) -> None:
        """New rules from a heartbeat; until the next, these stand (HOST-30). `counted_mb`
        is what the heartbeat that fetched them reported lent, which the controller took
        from their capacity already; a loan made since (the body was built before it) is
        still this side's to count."""
        self.rules = rules
        self._lent_since_rules = max(0, sum(self.loans().values()) - counted_mb)

    def loans(self) -> dict[int, int]:
        """MB lent to each runner above its guarantee (in observe mode, what would have
        been lent): HOST-29's record on the runner's row."""
        return {
            rid: w.limit_mb - w.guarantee_mb
            for rid, w in self._watches.items()
            if w.limit_mb > w.guarantee_mb
        }

    def blocked(self) -> dict[int, str]:
        """Runners whose needed raise the rules refused, and why (HOST-32's report)."""
        return {rid: w.blocked_why for rid, w in self._watches.items() if w.blocked}

    def due_at(self, runner_id: int) -> float:
        """When the runner is next looked at (0: now, such as a runner not seen yet)."""
        watch = self._watches.get(runner_id)
        return 0.0 if watch is None else watch.due

    def next_due(self) -> float | None:
        return min((w.due for w in self._watches.values()), default=None)

    def step(
        self,
        now: float,
        runner_ids: Iterable[int],
        read: Callable[[int], MemoryUse | None],
        raise_limit: Callable[[int, int], None],
        host_free_mb: Callable[[], int | None],
    ) -> list[str]:
        """Look at each runner that is due; raise where needed. One line per change."""
        lines: list[str] = []
        ids = set(runner_ids)
        for gone in set(self._watches) - ids:
            del self._watches[gone]
        for runner_id in sorted(ids):
            watch = self._watches.get(runner_id)
            if watch is not None and now < watch.due:
                continue
            try:
                use = read(runner_id)
            except Exception as exc:  # a failed look keeps what was known (HOST-12)
                log.debug("memory of runner %s unread: %s", runner_id, exc)
                continue
            if use is None or use.limit_mb <= 0:
                continue
            if watch is None:
                rule = self.rules.rule_for(runner_id) if self.rules else None
                guarantee = rule.guarantee_mb if rule else use.limit_mb
                watch = self._watches[runner_id] = _Watch(guarantee, use.limit_mb)
            if not self.observe:
                watch.limit_mb = max(watch.limit_mb, use.limit_mb)  # never lowered here
            seen = MemoryUse(use.used_mb, watch.limit_mb)
            line = self._look(runner_id, watch, seen, now, raise_limit, host_free_mb)
            if line:
                lines.append(line)
        return lines

    def _look(
        self,
        runner_id: int,
        watch: _Watch,
        use: MemoryUse,
        now: float,
        raise_limit: Callable[[int, int], None],
        host_free_mb: Callable[[], int | None],
    ) -> str | None:
        climb = 0.0
        if watch.last_used_mb is not None and watch.last_at is not None and now > watch.last_at:
            climb = (use.used_mb - watch.last_used_mb) / (now - watch.last_at)
        watch.last_used_mb, watch.last_at = use.used_mb, now
        line = None
        if use.used_mb * MEMORY_MARGIN > use.limit_mb:
            rule = self.rules.rule_for(runner_id) if self.rules else None
            lendable = (self.rules.capacity_mb if self.rules else 0) - self._lent_since_rules
            decision = plan_raise(use, rule, lendable, host_free_mb())
            if decision is not None and decision.limit_mb is not None and not self.observe:
                try:
                    raise_limit(runner_id, decision.limit_mb)
                except Exception as exc:  # the engine refused: said, and tried again next look
                    decision = RaiseDecision(None, "engine", f"the engine refused: {exc}"[:300])
            if decision is not None and decision.limit_mb is not None:
                self._lent_since_rules += decision.limit_mb - watch.limit_mb
                watch.limit_mb = decision.limit_mb
                watch.blocked = watch.blocked_why = ""
                verb = "would raise" if self.observe else "raised"
                line = f"runner {runner_id}: {verb} memory, {decision.reason}"
                use = MemoryUse(use.used_mb, decision.limit_mb)
            elif decision is not None and decision.blocked:
                why = f"using {use.used_mb:.0f} of {use.limit_mb} MB, {decision.reason}"
                if watch.blocked != decision.blocked:  # said once per cause, not every look
                    line = f"runner {runner_id}: memory raise blocked, {why}"
                watch.blocked, watch.blocked_why = decision.blocked, why
        watch.due = now + check_every(use, climb)
        return line
