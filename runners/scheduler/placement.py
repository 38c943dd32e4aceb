"""Placement: which hosts could run a pool, and which one takes each new runner (SCHED-05..12).

`HostIndex` answers for one decision, over the books `decide` charges as it plans:

* `offering(pool)`: hosts that offer the pool's backend, platform and selector, found
  through indexes (by backend and platform, by selector label) rather than by a scan;
* `capable(pool)`: those of them one runner of the pool fits when empty;
* `place(pool, need)`: up to `need` runners one by one, each on the host left with most
  headroom, from a heap per kind of pool instead of a scan of every host per runner;
* `why_no_room(pool)`: why the capable hosts take nothing now, for the blocked note.

Pools that look for the same hosts (same backend, platform and selector) with the same
size share one host list and one heap. Each entry carries the host's slot count when it
was ranked; once the host is charged again the entry is stale. Charging only ever makes a
host rank worse, so a stale entry ranks its host at least as well as it deserves: when
one reaches the top it is ranked afresh and sifted down (or dropped, the host full), and
an entry that is fresh at the top is the best host by the current books. (A mistyped pool
with a negative figure would make a host rank better: such a charge re-enters the host
fresh in every heap holding it.) The answers are exactly those of a scan
(tests/runners/scheduler/test_reference.py compares the two on random fleets).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence

from runners.scheduler.matching import (
    host_accepts_work,
    host_offers_pool,
    parse_platform,
    parsed_platforms_fit,
)
from runners.scheduler.model import HostView, PoolView
from runners.scheduler.resources import Charge, HostBooks, fits_empty, pool_charge

# How many hosts a "waits for room" note names before summarising the rest.
HOSTS_NAMED = 5

# (backend, (os, arch), selector): the hosts a pool can use, whatever its size.
_Signature = tuple[str, tuple[str | None, str | None], frozenset[tuple[str, str]]]
# (signature, cpus, memory_mb, dind): the hosts one runner fits and what it is charged.
_Kind = tuple[_Signature, float | None, int | None, bool]
# A heap entry, flat so that comparing two is cheap: -headroom after, -free slots after,
# host id (the smallest is the host to take a runner), the host's slots in use when ranked,
# an entry number (so a tie never compares charges), the charge.
_Entry = tuple[float, int, int, int, int, Charge]
# A placed runner: host id, CPUs and memory charged, and the placement note.
Placed = tuple[int, float | None, int | None, str]


def place_on(host_books: HostBooks, pool: PoolView, charge: Charge | None = None) -> Placed:
    """Charge one runner of the pool to the host; what it was charged and why there.

    `charge` is the pool's charge on this host when the caller has it already.
    """
    host = host_books.host
    if charge is None:
        charge = pool_charge(pool.cpus, pool.memory_mb, pool.dind, host)
    host_books.charge(charge)
    return host.id, charge.cpus, charge.memory_mb, placement_text(host_books)


def placement_text(books: HostBooks) -> str:
    """Why this host, as the Runners page shows it."""
    host = books.host
    parts = [f"{books.free_slots} of {host.capacity} slots"]
    if host.cpus:
        parts.append(f"{max(0.0, host.cpus - books.cpus_used):g} of {host.cpus:g} CPUs")
    if host.memory_mb:
        parts.append(f"{max(0, host.memory_mb - books.memory_used)} of {host.memory_mb} MB")
    return f"on {host.name}, the most headroom after placement: {', '.join(parts)} left"


def no_room_text(
    pool: PoolView, capable: Sequence[HostView], books: Mapping[int, HostBooks]
) -> str:
    """Each host that could run the pool, and why it takes nothing now (`capable` sorted
    by name and id); the first few are named, the rest counted."""
    reasons = []
    for host in capable[:HOSTS_NAMED]:
        if not host.healthy:
            why = "unhealthy"
        elif host.cordoned:
            why = "cordoned"
        elif host.pressure_hold:
            why = (
                f"under pressure: {host.hold_reason}"
                if host.hold_reason
                else ("under CPU or memory pressure")
            )
        else:
            charge = pool_charge(pool.cpus, pool.memory_mb, pool.dind, host)
            why = books[host.id].shortfall(charge) or "no room"
        reasons.append(f"{host.name} {why}")
    shown = "; ".join(reasons)
    if len(capable) > HOSTS_NAMED:
        shown += f"; and {len(capable) - HOSTS_NAMED} more"
    return shown


class HostIndex:
    """The hosts of one decision, indexed for the questions placement asks (see above)."""

    def __init__(self, hosts: Iterable[HostView], books: Mapping[int, HostBooks]) -> None:
        self._books = books
        # (backend, (os, arch)) -> hosts, each host under every backend it offers.
        self._by_shape: dict[tuple[str, tuple[str | None, str | None]], list[HostView]] = {}
        # A host label (key, value) -> hosts carrying it.
        self._by_label: dict[tuple[str, str], list[HostView]] = {}
        for host in hosts:
            platform = parse_platform(host.platform)
            for backend in {backend.lower() for backend in host.backends}:
                self._by_shape.setdefault((backend, platform), []).append(host)
            for pair in set(host.labels):
                self._by_label.setdefault(pair, []).append(host)
        self._offering: dict[_Signature, list[HostView]] = {}
        self._capable: dict[_Kind, list[HostView]] = {}
        self._heaps: dict[_Kind, list[_Entry]] = {}
        self._entries = itertools.count()
        # Host id -> the kinds whose heap holds it, with what one such runner costs it.
        self._host_kinds: dict[int, list[tuple[_Kind, Charge]]] = {}

    def offering(self, pool: PoolView) -> list[HostView]:
        """Hosts that offer the pool (backend, platform, selector), by name and id."""
        signature = _signature(pool)
        if signature not in self._offering:
            self._offering[signature] = sorted(
                self._find_offering(pool, signature), key=lambda h: (h.name, h.id)
            )
        return self._offering[signature]

    def capable(self, pool: PoolView) -> list[HostView]:
        """Hosts that offer the pool and fit one of its runners when empty, by name and id."""
        kind = _kind(pool)
        if kind not in self._capable:
            self._capable[kind] = [h for h in self.offering(pool) if fits_empty(pool, h)]
        return self._capable[kind]

    def place(self, pool: PoolView, need: int) -> list[Placed]:
        """Place up to `need` runners one by one, each on the host left with most headroom.

        Re-ranking after every placement spreads a burst over the hosts, and charging the
        shared books makes later pools see what this one took (SCHED-07, SCHED-08).
        """
        kind = _kind(pool)
        heap = self._heap(pool)
        placed: list[Placed] = []
        while len(placed) < need and heap:
            _, _, host_id, version, _, charge = heap[0]
            host_books = self._books[host_id]
            if version == host_books.slots_used:
                placed.append(place_on(host_books, pool, charge))
                if charge_lowers_usage(charge):
                    self._recharged(host_id, but=kind)
            # The host's entry at the top is stale now (or was: charged by another kind of
            # pool since): rank it afresh in place, one sift, or drop it once full.
            entry = self._entry(host_books, charge)
            if entry is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, entry)
        return placed

    def why_no_room(self, pool: PoolView) -> str:
        """Why each host that could run the pool takes nothing now."""
        return no_room_text(pool, self.capable(pool), self._books)

    def _find_offering(self, pool: PoolView, signature: _Signature) -> Iterable[HostView]:
        backend, platform, selector = signature
        if selector:
            # The hosts carrying the rarest selector label, checked in full.
            rarest = min((self._by_label.get(pair, []) for pair in selector), key=len)
            return [host for host in rarest if host_offers_pool(host, pool)]
        found: list[HostView] = []
        for (shape_backend, shape_platform), hosts in self._by_shape.items():
            if shape_backend == backend and parsed_platforms_fit(platform, shape_platform):
                found.extend(hosts)
        return found

    def _heap(self, pool: PoolView) -> list[_Entry]:
        """The heap of hosts for pools of this kind, made on first use from the books."""
        kind = _kind(pool)
        if kind not in self._heaps:
            entries = []
            for host in self.capable(pool):
                if not host_accepts_work(host):
                    continue
                host_books = self._books[host.id]
                charge = pool_charge(pool.cpus, pool.memory_mb, pool.dind, host_books.host)
                self._host_kinds.setdefault(host.id, []).append((kind, charge))
                entry = self._entry(host_books, charge)
                if entry is not None:
                    entries.append(entry)
            heapq.heapify(entries)
            self._heaps[kind] = entries
        return self._heaps[kind]

    def _recharged(self, host_id: int, but: _Kind) -> None:
        """A charge that lowered what the host uses (a negative figure): enter the host
        afresh in every other heap that holds it, since there its entry may now rank it
        worse than it is, or be missing because it did not fit."""
        host_books = self._books[host_id]
        for kind, charge in self._host_kinds.get(host_id, ()):
            if kind == but:
                continue
            entry = self._entry(host_books, charge)
            if entry is not None:
                heapq.heappush(self._heaps[kind], entry)

    def _entry(self, host_books: HostBooks, charge: Charge) -> _Entry | None:
        """The host's heap entry for runners with this charge, or None when none fits."""
        host_rank = host_books.rank(charge)
        if host_rank is None:
            return None
        headroom, slots = host_rank
        host_id = host_books.host.id
        return headroom, slots, host_id, host_books.slots_used, next(self._entries), charge


def charge_lowers_usage(charge: Charge) -> bool:
    """A charge with a negative figure (only a mistyped pool has one)."""
    return (charge.cpus or 0.0) < 0 or (charge.memory_mb or 0) < 0


def _signature(pool: PoolView) -> _Signature:
    return pool.backend.lower(), parse_platform(pool.platform), frozenset(pool.host_selector)


def _kind(pool: PoolView) -> _Kind:
    return _signature(pool), pool.cpus, pool.memory_mb, pool.dind
