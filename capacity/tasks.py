"""django-q2 entry points. Thin: each calls one function that takes the clock."""

from __future__ import annotations

import os
import secrets
import socket
import time
from datetime import timedelta

from django.utils import timezone

from capacity import delivery, loop, machines, metrics
from zoomies_site.core import controller_lock, leases

LEASE_NAME = "capacity"
LEASE_TTL = timedelta(minutes=2)


def capacity_step_task() -> int:
    """One capacity step, on the lease holder only (ESC-14: one sweeper at a time).

    ESC-19: the whole backstop, its spawn-timeout arm included, stands down while this
    controller cannot confirm it is the only one acting: another holds the capacity lease,
    or the controller's own lease was lost to another (controller.lease_lost), and the
    reap-blocked gauge reads 1 for exactly that time. Scale-ups and deliveries go on."""
    holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    if not leases.acquire(LEASE_NAME, holder=holder, now=timezone.now(), ttl=LEASE_TTL):
        metrics.REAP_BLOCKED.set(1)
        return 0
    try:
        alone = controller_lock.lease_lost_since() is None
        metrics.REAP_BLOCKED.set(0 if alone else 1)
        return len(loop.step(timezone.now(), run_backstop=alone).started)
    finally:
        leases.release(LEASE_NAME, holder=holder, force=True)


def deliver_task(attempt_id: int) -> str | None:
    """Deliver one attempt: its due tries, waiting out the backoff between them."""
    return delivery.deliver(attempt_id, clock=timezone.now, sleep=time.sleep)


def machine_loop_task() -> int:
    """One round of the machine loop, on the holder of its own lease (MACH-19, STORE-07)."""
    holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    if not leases.acquire(machines.LEASE_NAME, holder=holder, now=timezone.now(),
                          ttl=machines.LEASE_TTL):  # fmt: skip
        return 0
    try:
        return len(machines.step(timezone.now()).lines)
    finally:
        leases.release(machines.LEASE_NAME, holder=holder, force=True)
