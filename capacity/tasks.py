"""django-q2 entry points. Thin: each calls one function that takes the clock."""

from __future__ import annotations

import os
import secrets
import socket
import time
from datetime import timedelta

from django.utils import timezone

from capacity import delivery, loop, metrics
from zoomies_site.core import leases

LEASE_NAME = "capacity"
LEASE_TTL = timedelta(minutes=2)


def capacity_step_task() -> int:
    """One capacity step, on the lease holder only (ESC-14: one sweeper at a time)."""
    holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    if not leases.acquire(LEASE_NAME, holder=holder, now=timezone.now(), ttl=LEASE_TTL):
        # ESC-19: another controller holds the lease; this one's backstop stands down.
        metrics.REAP_BLOCKED.set(1)
        return 0
    metrics.REAP_BLOCKED.set(0)
    try:
        return len(loop.step(timezone.now()).started)
    finally:
        leases.release(LEASE_NAME, holder=holder, force=True)


def deliver_task(attempt_id: int) -> str | None:
    """Deliver one attempt: its due tries, waiting out the backoff between them."""
    return delivery.deliver(attempt_id, clock=timezone.now, sleep=time.sleep)
