"""A container's memory through the engine's HTTP API, for the memory valve (HOST-12,
HOST-27): its use as `docker stats` counts it, and its limit raised in place."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fleet.agent.memory_valve import MemoryUse

MB = 1024 * 1024
SAMPLE_TIMEOUT = 5.0  # HOST-12: a sample past this is given up on


def container_use(api: Any, name: str) -> MemoryUse | None:
    """Use and limit from one `stats?stream=false&one-shot=true` (no second read to wait
    for). Use leaves out reclaimable page cache, as `docker stats` does: inactive_file on
    cgroup v2, total_inactive_file on v1. None for a container that is not running or has
    no limit."""
    url = f"{api.base_url}/v{api.api_version}/containers/{quote(name, safe='')}/stats"
    answer = api.get(url, params={"stream": "false", "one-shot": "true"},
                     timeout=SAMPLE_TIMEOUT)  # fmt: skip
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    stats = answer.json().get("memory_stats") or {}
    usage, limit = stats.get("usage"), stats.get("limit")
    if not usage or not limit:
        return None  # not running: the engine reports no memory at all
    detail = stats.get("stats") or {}
    cache = detail.get("inactive_file", detail.get("total_inactive_file", 0)) or 0
    limit_mb = int(limit // MB)
    # An unlimited container reports the machine as its limit; the caller knows its figure.
    return MemoryUse(used_mb=max(0, usage - cache) / MB, limit_mb=limit_mb)


def raise_limit(api: Any, name: str, limit_mb: int) -> None:
    """Memory raised in place, with memory+swap moved by as much (the engine refuses a
    memory limit above the swap limit): the swap the container was created with, none
    included, is what it keeps; an unlimited swap stays unlimited."""
    host = api.inspect_container(name).get("HostConfig") or {}
    memory, swap = int(host.get("Memory") or 0), int(host.get("MemorySwap") or 0)
    limit = int(limit_mb) * MB
    if swap == -1:
        new_swap = -1
    else:
        new_swap = limit + max(0, swap - memory) if swap > 0 else limit
    url = f"{api.base_url}/v{api.api_version}/containers/{quote(name, safe='')}/update"
    api.post(url, json={"Memory": limit, "MemorySwap": new_swap}, timeout=30).raise_for_status()
