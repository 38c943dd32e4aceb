"""`decide()` on synthetic fleets: how the pure scheduler's cost grows with the fleet.

    .venv/bin/python -m bench.scheduler [--sizes 100/20/1000 1000/200/10000 ...] [--repeat 3]

A fleet is H hosts, P pools and J queued jobs, with about one live runner per host already
placed (idle, busy, starting and some failed or removed rows), in two label layouts:

* uniform: every pool and host is docker on linux/x64 with no selector; pools differ only
  by their labels, so every host could run every pool (the widest search there is);
* partitioned: pools and hosts come in groups of about ten pools, each group with its own
  backend, platform and a `zone` selector, so each pool can use only its group's hosts.

Pools draw their sizes from a few shapes (slot share, 1 CPU / 2 GB, 2 CPUs / 4 GB, a dind
pair), as real pools do. Jobs ask for `self-hosted`, the platform and one pool's label.
The figure is the best of `--repeat` timed calls (the minimum is the least noisy estimate
of the cost on a shared machine), and the growth is the ratio between consecutive sizes.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from runners.scheduler import (
    HostView,
    JobView,
    PoolView,
    RunnerView,
    SchedulerSettings,
    Snapshot,
    decide,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SIZES = ((100, 20, 1_000), (1_000, 200, 10_000), (5_000, 500, 50_000))
QUICK_SIZES = ((100, 20, 1_000), (1_000, 200, 10_000))
LAYOUTS = ("uniform", "partitioned")
_GROUP_SHAPES = (
    ("docker", "linux/x64"),
    ("podman", "linux/x64"),
    ("docker", "linux/arm64"),
    ("process", "windows/x64"),
)
_POOL_SIZES = ((None, None, False), (1.0, 2048, False), (2.0, 4096, False), (1.0, 2048, True))
_STATES = ("idle",) * 4 + ("busy",) * 4 + ("provisioning", "registering", "failed", "removed")


def make_snapshot(hosts: int, pools: int, jobs: int, layout: str, seed: int = 1) -> Snapshot:
    """A deterministic synthetic fleet of this size and label layout."""
    rnd = random.Random(f"{hosts}/{pools}/{jobs}/{layout}/{seed}")
    groups = 1 if layout == "uniform" else max(1, pools // 10)

    def shape(group: int) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        if layout == "uniform":
            return "docker", "linux/x64", ()
        backend, platform = _GROUP_SHAPES[group % len(_GROUP_SHAPES)]
        return backend, platform, (("zone", f"z{group}"),)

    pool_views = []
    for i in range(pools):
        group = i % groups
        backend, platform, selector = shape(group)
        cpus, memory, dind = _POOL_SIZES[rnd.randrange(len(_POOL_SIZES))]
        pool_views.append(
            PoolView(
                id=i + 1,
                name=f"pool-{i:05d}",
                labels=(f"label-{i}",),
                backend=backend,
                platform=platform,
                host_selector=selector,
                image="",
                cpus=cpus,
                memory_mb=memory,
                dind=dind,
                warm=rnd.choice((0, 0, 0, 1)),
                max_runners=rnd.choice((20, 50, 100)),
                paused=rnd.random() < 0.03,
            )
        )
    host_views = []
    for i in range(hosts):
        group = i % groups
        backend, platform, selector = shape(group)
        host_views.append(
            HostView(
                id=i + 1,
                name=f"host-{i:05d}",
                healthy=rnd.random() > 0.02,
                cordoned=rnd.random() < 0.02,
                backends=(backend,),
                platform=platform,
                labels=selector,
                capacity=rnd.choice((4, 8, 16)),
                cpus=rnd.choice((None, 8.0, 16.0, 32.0)),
                memory_mb=rnd.choice((None, 16384, 32768, 65536)),
            )
        )
    runners = []
    for i in range(hosts):
        host = host_views[rnd.randrange(hosts)]
        group_pools = [p for p in pool_views[(host.id - 1) % groups :: groups]] or pool_views
        pool = group_pools[rnd.randrange(len(group_pools))]
        state = rnd.choice(_STATES)
        age = timedelta(seconds=rnd.randrange(30, 3 * 3600))
        finished = NOW - timedelta(seconds=rnd.randrange(0, 900))
        runners.append(
            RunnerView(
                id=i + 1,
                pool_id=pool.id,
                host_id=host.id,
                state=state,
                created_at=NOW - age,
                state_changed_at=NOW - age / 2,
                finished_at=finished if state in ("failed", "removed") else None,
            )
        )
    job_views = []
    for i in range(jobs):
        pool = pool_views[rnd.randrange(pools)]
        os_name, arch = (pool.platform or "linux/x64").split("/")
        job_views.append(
            JobView(
                id=i + 1,
                labels=("self-hosted", os_name, arch, pool.labels[0]),
                repository=f"octo/repo-{i % 97}",
                installation_id=None,
                created_at=NOW - timedelta(seconds=rnd.randrange(1, 600)),
            )
        )
    return Snapshot(
        now=NOW,
        pools=tuple(pool_views),
        hosts=tuple(host_views),
        runners=tuple(runners),
        queued_jobs=tuple(job_views),
        settings=SchedulerSettings(default_idle_timeout=timedelta(minutes=30)),
    )


@dataclass
class Timing:
    hosts: int
    pools: int
    jobs: int
    layout: str
    seconds: float  # best CPU time of the repeats
    wall: float  # best wall time of the repeats
    creates: int
    blocked: int
    growth: float | None = None  # this size's time over the previous size's


def time_decide(snap: Snapshot, repeat: int) -> tuple[float, float, int, int]:
    """(best CPU seconds, best wall seconds, creates, runners blocked) over the repeats.

    CPU time of this one thread is the figure: on a machine shared with other work the
    wall time also counts the time the thread waited for a core.
    """
    best_cpu = best_wall = float("inf")
    plan = None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.thread_time()
        plan = decide(snap)
        best_cpu = min(best_cpu, time.thread_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    assert plan is not None
    return best_cpu, best_wall, len(plan.creates), sum(b.count for b in plan.blocked)


def run(sizes=SIZES, layouts=LAYOUTS, repeat: int = 3) -> list[Timing]:
    timings = []
    for layout in layouts:
        previous = None
        for hosts, pools, jobs in sizes:
            snap = make_snapshot(hosts, pools, jobs, layout)
            seconds, wall, creates, blocked = time_decide(snap, repeat)
            timing = Timing(hosts, pools, jobs, layout, seconds, wall, creates, blocked)
            if previous is not None:
                timing.growth = seconds / previous.seconds
            timings.append(timing)
            previous = timing
    return timings


def _size(text: str) -> tuple[int, int, int]:
    hosts, pools, jobs = (int(x) for x in text.split("/"))
    return hosts, pools, jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=_size, default=list(SIZES))
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    for t in run(args.sizes, args.layouts, args.repeat):
        growth = f"{t.growth:.1f}x" if t.growth is not None else "-"
        print(
            f"{t.layout:11} {t.hosts:>5}/{t.pools:<4}/{t.jobs:<6} {t.seconds * 1000:9.1f} ms CPU "
            f"({t.wall * 1000:.1f} ms wall) "
            f"growth {growth:>6}  creates {t.creates} blocked {t.blocked}",
            flush=True,
        )


if __name__ == "__main__":
    main()
