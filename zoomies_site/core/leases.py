"""Lease rows: one holder at a time for loops that must not run twice (STORE-07).

A lease is taken with a compare-and-set, so the same code is correct on SQLite and on
PostgreSQL with several worker processes. A wake that arrives while the lease is held marks
it dirty; the holder sees that when it lets go and runs once more, so wakes coalesce.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path

from django.db import IntegrityError, transaction
from django.db.models import Q

from zoomies_site.core.models import Lease


def _ensure(name: str) -> None:
    if not Lease.objects.filter(name=name).exists():
        try:
            with transaction.atomic():
                Lease.objects.create(name=name)
        except IntegrityError:
            pass  # created by a concurrent caller


def acquire(name: str, *, holder: str, now: datetime, ttl: timedelta) -> bool:
    """Take the lease if it is free, expired, already ours, or held by a process of this
    host that is gone; True when held.

    The last: a worker killed mid-pass (several `workers` on one machine, or a controller's
    cluster) would otherwise hold its loop for the whole TTL, five minutes of no reconcile;
    on this host its death is a fact (`host:pid` holders, pid_alive), taken over by a
    compare-and-set on the holder read. A holder on another host is waited out to expiry.
    """
    _ensure(name)
    taken = (
        Lease.objects.filter(name=name)
        .filter(Q(holder="") | Q(expires_at__lt=now) | Q(holder=holder))
        .update(holder=holder, expires_at=now + ttl, acquired_at=now, dirty=False)
    )
    if taken:
        return True
    current = Lease.objects.filter(name=name).values_list("holder", flat=True).first() or ""
    if not _gone_from_this_host(current, holder):
        return False
    return bool(
        Lease.objects.filter(name=name, holder=current).update(
            holder=holder, expires_at=now + ttl, acquired_at=now, dirty=False
        )
    )


def _gone_from_this_host(current: str, holder: str) -> bool:
    """`current` (host:pid[:token]) names this caller's host and a process that has ended."""
    host, _, rest = current.partition(":")
    pid = rest.partition(":")[0]
    return (
        bool(host)
        and host == holder.partition(":")[0]
        and pid.isdigit()
        and not pid_alive(int(pid))
    )


def renew(name: str, *, holder: str, now: datetime, ttl: timedelta) -> bool:
    return bool(Lease.objects.filter(name=name, holder=holder).update(expires_at=now + ttl))


def mark_dirty(name: str) -> None:
    _ensure(name)
    Lease.objects.filter(name=name).update(dirty=True)


def release(name: str, *, holder: str, force: bool = False) -> bool:
    """Let go unless a wake arrived meanwhile; True when let go with no wake pending.

    Without `force`, False means the lease was marked dirty while held: the mark is
    cleared, the caller still holds the lease and should run once more. With `force` the
    lease is let go either way, and False says a wake arrived that someone must serve.
    """
    released = Lease.objects.filter(name=name, holder=holder, dirty=False).update(
        holder="", expires_at=None
    )
    if released:
        return True
    if force:
        Lease.objects.filter(name=name, holder=holder).update(
            holder="", expires_at=None, dirty=False
        )
        return False
    Lease.objects.filter(name=name, holder=holder).update(dirty=False)
    return not Lease.objects.filter(name=name, holder=holder).exists()


def claim_flag(name: str) -> bool:
    """Set a named flag (a lease row's `dirty`); True only if this call turned it on."""
    _ensure(name)
    return bool(Lease.objects.filter(name=name, dirty=False).update(dirty=True))


def clear_flag(name: str) -> None:
    Lease.objects.filter(name=name, dirty=True).update(dirty=False)


def holder_of(name: str) -> tuple[str, datetime | None]:
    row = Lease.objects.filter(name=name).values_list("holder", "expires_at").first()
    return row if row else ("", None)


def pid_alive(pid: int) -> bool:
    """A process with this pid runs. A zombie does not: it has died and only waits for its
    parent (init, once its controller was killed) to reap it, which may take a while, and
    `kill(pid, 0)` still succeeds on it (issue 21 item 17)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive unless it is a zombie, just not ours to signal
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False  # gone since the kill above
    except OSError:
        return True  # no /proc to read: what kill() said stands
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def held_by_live_processes(
    *, host: str, keep: Iterable[str] = (), alive: Callable[[int], bool] = pid_alive
) -> set[tuple[str, str]]:
    """The (name, holder) pairs of leases held on `host` by a process that still runs."""
    rows = Lease.objects.filter(holder__startswith=f"{host}:").exclude(name__in=list(keep))
    return {
        (name, holder)
        for name, holder in rows.values_list("name", "holder")
        if (pid := holder.split(":")[1]).isdigit() and alive(int(pid))
    }


def still_held(pairs: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of these (name, holder) pairs are still held by that holder."""
    pairs = set(pairs)
    rows = Lease.objects.filter(name__in=[name for name, _ in pairs])
    return pairs & set(rows.values_list("name", "holder"))


def take_over_dead_holders(
    *, host: str, keep: Iterable[str] = (), alive: Callable[[int], bool] = pid_alive
) -> list[str]:
    """Free every lease held on `host` by a process that is gone; returns the names freed.

    Holders are `host:pid[:token]`. Only the controller calls this, once it holds the file
    lock beside the database: no other controller on this host can be running, so a lease
    whose pid is dead was left by a killed predecessor (or its workers) and would otherwise
    block every pass until it expired (issue 11 item 3). Each is freed by a compare-and-set
    on the holder it read, and marked dirty so the next caller runs the pass it was owed.
    """
    freed = []
    rows = Lease.objects.filter(holder__startswith=f"{host}:").exclude(name__in=list(keep))
    for name, holder in rows.values_list("name", "holder"):
        pid_text = holder.split(":")[1] if holder.count(":") >= 1 else ""
        if not pid_text.isdigit() or alive(int(pid_text)):
            continue
        if Lease.objects.filter(name=name, holder=holder).update(
            holder="", expires_at=None, dirty=True
        ):
            freed.append(name)
    return freed
