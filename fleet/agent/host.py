"""What the agent measures about its own host: size (HOST-07), work-dir disk (HOST-08), usage."""

from __future__ import annotations

import os
import platform as platform_module
import threading
from dataclasses import dataclass
from pathlib import Path

MB = 1024 * 1024


def platform_name(machine: str | None = None) -> str:
    """linux/x64 or linux/arm64, the names pools ask for."""
    machine = (machine or platform_module.machine()).lower()
    if machine in ("x86_64", "amd64", "x64"):
        arch = "x64"
    elif machine in ("aarch64", "arm64", "armv8l"):
        arch = "arm64"
    else:
        arch = machine or "unknown"
    return f"linux/{arch}"


def _own_cgroup(proc_root: Path) -> str | None:
    """The cgroup v2 path of this process ("0::/some/path"), or None on v1 or no /proc."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def _cgroup_dirs(cgroup_root: Path, own: str) -> list[Path]:
    """Our cgroup and each ancestor up to the root: the tightest limit on the way counts."""
    parts = [p for p in own.strip("/").split("/") if p and p != ".."]
    return [cgroup_root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_limits(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_root: Path = Path("/proc")
) -> tuple[float | None, int | None]:
    """(cpus, memory bytes) the agent's cgroup v2 allows, each None when unlimited."""
    own = _own_cgroup(proc_root)
    if own is None:
        return None, None
    cpus: float | None = None
    memory: int | None = None
    for directory in _cgroup_dirs(cgroup_root, own):
        try:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            if quota != "max" and int(period) > 0:
                share = int(quota) / int(period)
                cpus = share if cpus is None else min(cpus, share)
        except (OSError, ValueError):
            pass
        try:
            raw = (directory / "memory.max").read_text().strip()
            if raw != "max":
                memory = int(raw) if memory is None else min(memory, int(raw))
        except (OSError, ValueError):
            pass
    return cpus, memory


def meminfo(proc_root: Path = Path("/proc")) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    values: dict[str, int] = {}
    try:
        lines = (proc_root / "meminfo").read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return values


def machine_cpus() -> int:
    try:
        # Affinity is the honest count under taskset or a cpuset; cpu_count is the fallback.
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_size(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_root: Path = Path("/proc")
) -> tuple[float, int]:
    """(cpus, memory_mb) for runners that are children of the agent: its cgroup's limit if
    it has one, else the machine (HOST-07)."""
    cg_cpus, cg_memory = cgroup_limits(cgroup_root, proc_root)
    cpus = float(machine_cpus())
    if cg_cpus is not None:
        cpus = min(cpus, cg_cpus)
    total = meminfo(proc_root).get("MemTotal", 0)
    memory = min(total, cg_memory) if cg_memory is not None and total else (cg_memory or total)
    return round(cpus, 2), memory // MB


@dataclass(frozen=True)
class DiskSpace:
    """The work directory's filesystem, in MB (HOST-08)."""

    total_mb: int
    free_mb: int


def work_dir_space(path: Path | str) -> DiskSpace | None:
    """None when the filesystem cannot be asked: the controller then keeps what it knew."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    # f_bavail, not f_bfree: the root-reserved blocks are not the runners' to use.
    return DiskSpace(
        total_mb=stat.f_blocks * stat.f_frsize // MB, free_mb=stat.f_bavail * stat.f_frsize // MB
    )


class UsageSampler:
    """CPU percent since the previous sample, memory in use and load1, for heartbeats."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self._previous: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def _cpu_times(self) -> tuple[int, int] | None:
        try:
            first = (self.proc_root / "stat").read_text().splitlines()[0].split()
        except (OSError, IndexError):
            return None
        if not first or first[0] != "cpu":
            return None
        values = [int(v) for v in first[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values), idle

    def sample(self) -> dict[str, float]:
        usage: dict[str, float] = {}
        with self._lock:
            times = self._cpu_times()
            if times and self._previous:
                total = times[0] - self._previous[0]
                idle = times[1] - self._previous[1]
                if total > 0:
                    usage["cpu_percent"] = round(100.0 * (total - idle) / total, 1)
            self._previous = times
        info = meminfo(self.proc_root)
        if "MemTotal" in info and "MemAvailable" in info:
            usage["memory_used_mb"] = (info["MemTotal"] - info["MemAvailable"]) // MB
        try:
            usage["load1"] = round(os.getloadavg()[0], 2)
        except OSError:
            pass
        return usage
