"""The scheduler's searches done the straightforward way, as they were before the indexes.

`decide_reference(snapshot)` is `decide` with every job matched by a scan of every pool
(`pool_for_job`) and every runner placed by a scan of every host, re-ranked after each
placement. Slow (jobs x pools, runners x hosts) and obviously right: the fast path must
give exactly its plan (test_reference.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from runners.scheduler import HostView, JobView, Plan, PoolView, Snapshot
from runners.scheduler.decide import decide_with
from runners.scheduler.matching import (
    host_accepts_work,
    host_offers_pool,
    pool_for_job,
)
from runners.scheduler.placement import Placed, no_room_text, place_on
from runners.scheduler.resources import HostBooks, fits_empty, pool_charge


def assign_jobs_by_scan(
    jobs: Iterable[JobView], pools: Iterable[PoolView]
) -> Mapping[int, tuple[JobView, ...]]:
    """Each job (first copy of an id in a total order) to `pool_for_job` over every pool."""
    pool_list = tuple(pools)
    by_pool: dict[int, list[JobView]] = {}
    seen: set[int] = set()
    ordered = sorted(
        jobs,
        key=lambda j: (
            j.id,
            j.created_at,
            j.labels,
            j.repository,
            j.installation_id is None,
            j.installation_id or 0,
        ),
    )
    for job in ordered:
        if job.id in seen:
            continue
        seen.add(job.id)
        pool = pool_for_job(job, pool_list)
        if pool is not None:
            by_pool.setdefault(pool.id, []).append(job)
    return {pool_id: tuple(found) for pool_id, found in by_pool.items()}


def rank(host_books: HostBooks, pool: PoolView) -> tuple[float, int, int] | None:
    """The host's rank for one more runner of the pool (the smallest wins), None if full."""
    charge = pool_charge(pool.cpus, pool.memory_mb, pool.dind, host_books.host)
    if host_books.shortfall(charge) is not None:
        return None
    headroom, slots_after = host_books.headroom_after(charge)
    return (-round(headroom, 9), -slots_after, host_books.host.id)


class ScanHosts:
    """Every question answered by walking every host."""

    def __init__(self, hosts: Iterable[HostView], books: Mapping[int, HostBooks]) -> None:
        self.hosts = tuple(hosts)
        self.books = books

    def offering(self, pool: PoolView) -> Sequence[HostView]:
        return sorted(
            (h for h in self.hosts if host_offers_pool(h, pool)), key=lambda h: (h.name, h.id)
        )

    def capable(self, pool: PoolView) -> Sequence[HostView]:
        return [h for h in self.offering(pool) if fits_empty(pool, h)]

    def place(self, pool: PoolView, need: int) -> list[Placed]:
        capable = self.capable(pool)
        placed = []
        for _ in range(need):
            best = None
            for host in capable:
                if not host_accepts_work(host):
                    continue
                host_rank = rank(self.books[host.id], pool)
                if host_rank is not None and (best is None or host_rank < best[0]):
                    best = (host_rank, self.books[host.id])
            if best is None:
                break
            placed.append(place_on(best[1], pool))
        return placed

    def why_no_room(self, pool: PoolView) -> str:
        return no_room_text(pool, self.capable(pool), self.books)


def decide_reference(snapshot: Snapshot) -> Plan:
    return decide_with(snapshot, assign_jobs_by_scan, ScanHosts)
