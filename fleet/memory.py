"""A host's memory rules from its rows and its last sample (HOST-24, HOST-25): what the
heartbeat answer carries to the agent's valve. The arithmetic is fleet/memory_planner.py's;
this module only reads what it needs."""

from __future__ import annotations

from fleet.memory_planner import HostMemory, MemoryPlan, plan_memory_pool
from fleet.models import Host
from fleet.runner_side import runner_side
from fleet.throttling import sample_of


def memory_plan_for(host: Host, *, only_if_lending: bool = False) -> MemoryPlan | None:
    """None for a host that has not said how much memory it has; with `only_if_lending`,
    None too for a host with no runner a memory limit binds (the heartbeat's cheap path:
    one query for a host that has nothing to lend to, not the held-back start's three)."""
    if not host.memory_mb:
        return None
    side = runner_side()
    runners = tuple(side.memory_of_runners(host))
    if only_if_lending and not any(r.guarantee_mb for r in runners):
        return None
    sample = sample_of(host)
    free = None
    if sample is not None and sample.memory_used_mb is not None:
        free = max(0, host.memory_mb - sample.memory_used_mb)
    return plan_memory_pool(
        HostMemory(
            machine_mb=host.memory_mb,
            free_mb=free,
            runners=runners,
            held_back_mb=side.queued_start_memory(host),
        )
    )
