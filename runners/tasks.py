"""django-q2 task entry points. Thin: each calls one function that takes `now`."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone


def reconcile_task() -> int:
    from runners.reconcile import reconcile_now

    reports = reconcile_now()
    return sum(len(r.created) for r in reports or [])


def housekeeping_task() -> int:
    from runners.housekeeping import housekeeping_step

    return len(housekeeping_step(timezone.now()).lines)


def poll_task() -> str:
    from runners.poller import poll_step

    return str(poll_step(timezone.now()))


def reap_task(started_at: str) -> str:
    from runners.reap import reap_step

    return str(reap_step(timezone.now(), started_at=datetime.fromisoformat(started_at)))
