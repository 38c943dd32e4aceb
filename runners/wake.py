"""Waking the reconcile pass at once (HOOK-04), coalesced.

A burst of webhooks must not become a burst of reconcile tasks: each wake sets a flag with
one conditional UPDATE, and only the wake that turned it on enqueues a django-q2 task. The
task clears the flag before it starts its pass, so a wake that lands during the pass
enqueues one more, and none is lost. A task lost with its worker leaves the flag on; the
controller's ticker enqueues passes regardless, so that costs at most one ticker period.
"""

from __future__ import annotations

import logging

log = logging.getLogger("zoomies.runners")

WAKE_FLAG = "reconcile.wake"

# Tests and the controller can observe wakes without patching.
wake_count = 0
enqueued_count = 0


def _claim_wake() -> bool:
    """Turn the pending-wake flag on; True only for the caller that turned it on."""
    from zoomies_site.leases import claim_flag

    return claim_flag(WAKE_FLAG)


def clear_wake() -> None:
    """Called by the reconcile task before its pass: later wakes enqueue another."""
    from zoomies_site.leases import clear_flag

    clear_flag(WAKE_FLAG)


def wake_reconcile() -> None:
    """Ask for a reconcile pass soon. Never raises: a lost wake costs one ticker period."""
    global wake_count, enqueued_count
    wake_count += 1
    try:
        if not _claim_wake():
            return  # a pass is already queued and has not started: it will see this change
        from django_q.tasks import async_task

        async_task("runners.tasks.reconcile_task", group="reconcile", q_options={"timeout": 300})
        enqueued_count += 1
    except Exception:  # a wake must never fail the request that asked for it
        log.exception("could not enqueue a reconcile pass")
