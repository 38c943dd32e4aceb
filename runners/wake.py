"""Waking the reconcile pass at once (HOOK-04): a django-q2 task, coalesced by the lease."""

from __future__ import annotations

import logging

log = logging.getLogger("zoomies.runners")

# Tests and the controller can observe wakes without patching.
wake_count = 0


def wake_reconcile() -> None:
    """Ask for a reconcile pass soon. Never raises: a lost wake costs one ticker period."""
    global wake_count
    wake_count += 1
    try:
        from django.conf import settings

        if getattr(settings, "ZOOMIES_SYNC_WAKE", False):
            # Tests with no worker cluster run the pass inline.
            from runners.reconcile import reconcile_now

            reconcile_now()
            return
        from django_q.tasks import async_task

        async_task("runners.tasks.reconcile_task", group="reconcile", q_options={"timeout": 300})
    except Exception:  # a wake must never fail the request that asked for it
        log.exception("could not enqueue a reconcile pass")
