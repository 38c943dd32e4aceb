"""django-q2 task entry points. Thin: each calls one function that takes `now`."""

from __future__ import annotations

import os
import secrets
import socket
from datetime import datetime, timedelta

from django.utils import timezone

from runners import auto_pools
from runners.housekeeping import housekeeping_step
from runners.poller import poll_step
from runners.reap import reap_step
from runners.reconcile import LEASE_NAME, LEASE_TTL, reconcile_now
from runners.redelivery import redelivery_step
from runners.wake import wake_reconcile
from zoomies_site.core import leases

SWEEP_LEASE_TTL = timedelta(minutes=5)


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def reconcile_task() -> int:
    # The wake's flag is cleared before the pass reads anything: a wake during it enqueues
    # the next one.
    reports = reconcile_now(woken=True)
    return sum(len(r.created) for r in reports or [])


def housekeeping_task() -> int:
    return len(housekeeping_step(timezone.now()).lines)


def poll_task(started_at: str | None = None) -> str:
    """One poll sweep at a time: a slow sweep must not overlap the next and spend quota twice.

    `started_at` is when the controller started: deliveries from before it do not count as
    arriving, so the first sweep after a restart catches up on what was missed.
    """
    holder = _holder()
    if not leases.acquire("poll", holder=holder, now=timezone.now(), ttl=SWEEP_LEASE_TTL):
        return "another poll sweep is running"
    try:
        since = datetime.fromisoformat(started_at) if started_at else None
        return str(poll_step(timezone.now(), started_at=since))
    finally:
        leases.release("poll", holder=holder, force=True)


def redelivery_task() -> str:
    """One redelivery pass at a time: two would list the same deliveries twice (the guid
    claims keep them from asking twice, but the calls would be spent)."""
    holder = _holder()
    if not leases.acquire("redelivery", holder=holder, now=timezone.now(), ttl=SWEEP_LEASE_TTL):
        return "another redelivery pass is running"
    try:
        return str(redelivery_step(timezone.now()))
    finally:
        leases.release("redelivery", holder=holder, force=True)


def auto_pools_task(started_at: str = "") -> str:
    """SCHED-30: one automatic-pool pass at a time, under its own lease, never the
    reconcile pass's. The wake flag is cleared first, so a wake during the pass queues
    one more."""
    if not auto_pools.enabled():
        return "automatic pools are off (scheduler.auto_pools)"
    holder = _holder()
    now = timezone.now()
    if not leases.acquire(auto_pools.LEASE_NAME, holder=holder, now=now, ttl=auto_pools.LEASE_TTL):
        return "another automatic-pool pass is running"
    try:
        auto_pools.clear_wake()
        since = datetime.fromisoformat(started_at) if started_at else None
        return "; ".join(auto_pools.step(now, started_at=since)) or "nothing to change"
    finally:
        leases.release(auto_pools.LEASE_NAME, holder=holder, force=True)


def reap_task(started_at: str) -> str:
    """The registration reap runs under the reconcile lease.

    A pass mints its JIT configurations before it writes their rows; a reap listing
    registrations in that window would see ones no row explains yet and delete them.
    Holding the same lease makes the two exclusive.
    """
    holder = _holder()
    if not leases.acquire(LEASE_NAME, holder=holder, now=timezone.now(), ttl=LEASE_TTL):
        return "a reconcile pass is running; the reap waits for the next tick"
    try:
        return str(reap_step(timezone.now(), started_at=datetime.fromisoformat(started_at)))
    finally:
        if not leases.release(LEASE_NAME, holder=holder, force=True):
            # A pass was asked for while the reap held the lease: serve it now.
            wake_reconcile()
