"""The throttle, applied (HOST-13..19): the controller's step that reads each host's last
usage sample and moves its throttle by the pure `fleet.throttle.next_throttle`, and the
sample and effective capacity the scheduler's snapshot reads.

Only this step writes the throttle fields, from what the host measured (HOST-19): a
heartbeat stores the sample and nothing else, so nothing an agent sends can set or clear a
level.
"""

from __future__ import annotations

import logging
from datetime import datetime

from fleet.models import Host
from fleet.states import HostHealth
from fleet.throttle import Sample, ThrottleState, effective_capacity, next_throttle, pressure_hold
from zoomies_site.core import registry
from zoomies_site.core.events import emit

log = logging.getLogger("zoomies.throttle")


def _number(usage: dict, key: str) -> float | None:
    value = usage.get(key)
    return float(value) if isinstance(value, int | float) else None


def sample_of(host: Host) -> Sample | None:
    """The host's last usage sample (HOST-11: stored with the controller's time of
    receipt), with the machine it was taken on; None before the first."""
    usage = host.usage if isinstance(host.usage, dict) else {}
    if host.usage_at is None or not usage:
        return None
    used = _number(usage, "memory_used_mb")
    return Sample(
        at=host.usage_at,
        cpus=host.cpus,
        cpu_percent=_number(usage, "cpu_percent"),
        load1=_number(usage, "load1"),
        memory_total_mb=host.memory_mb,
        memory_used_mb=None if used is None else int(used),
        unbound_runner=bool(usage.get("unbound_runner")),
    )


def hold_of(host: Host, now: datetime) -> str:
    """HOST-13: why a fresh sample holds new starts on this host, or "" (none, or
    scheduler.host_throttling off)."""
    if not registry.get("scheduler.host_throttling"):
        return ""
    return pressure_hold(sample_of(host), now)


def capacity_of(host: Host) -> int:
    """The host's slots after its throttle (HOST-14, HOST-18)."""
    return effective_capacity(host.capacity, host.throttle_level)


def throttle_step(now: datetime) -> list[str]:
    """Move each healthy host's throttle by at most one level; a line per level change."""
    enabled = bool(registry.get("scheduler.host_throttling"))
    lines = []
    hosts = Host.objects.filter(health=HostHealth.HEALTHY).exclude(
        throttle_level=0, usage_at__isnull=True
    )
    for host in hosts:
        state = ThrottleState(
            level=host.throttle_level,
            changed_at=host.throttle_changed_at,
            calm_since=host.throttle_calm_since,
        )
        decision = next_throttle(
            now=now,
            state=state,
            sample=sample_of(host),
            configured_capacity=host.capacity,
            enabled=enabled,
        )
        moved = (decision.level, decision.changed_at, decision.calm_since) != (
            state.level, state.changed_at, state.calm_since,
        )  # fmt: skip
        if not moved and decision.reason == host.throttle_reason:
            continue
        Host.objects.filter(pk=host.pk).update(
            throttle_level=decision.level,
            throttle_changed_at=decision.changed_at,
            throttle_calm_since=decision.calm_since,
            throttle_reason=decision.reason[:300],
        )
        if decision.level != state.level:
            emit("host.throttled", host, at=now)
            line = f"{host.name}: throttle {state.level} -> {decision.level}: {decision.reason}"
            log.info("%s", line)
            lines.append(line)
    return lines
