"""Waking the reconcile pass at once (HOOK-04), coalesced.

A burst of webhooks must not become a burst of reconcile tasks: each wake sets a flag with
one conditional UPDATE, and only the wake that turned it on enqueues a django-q2 task. The
task clears the flag before it starts its pass, so a wake that lands during the pass
enqueues one more, and none is lost. A task lost with its worker leaves the flag on; the
controller's ticker enqueues passes regardless, so that costs at most one ticker period.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from zoomies_site.core import metrics
from zoomies_site.core.faultlog import FaultLog
from zoomies_site.core.leases import claim_flag, clear_flag

log = logging.getLogger("zoomies.runners")
_faults = FaultLog(log, "a reconcile wake")

WAKE_FLAG = "reconcile.wake"


def _claim_wake() -> bool:
    """Turn the pending-wake flag on; True only for the caller that turned it on."""
    return claim_flag(WAKE_FLAG)


def clear_wake() -> None:
    """Called by the reconcile task before its pass: later wakes enqueue another."""
    clear_flag(WAKE_FLAG)


def wake_reconcile() -> None:
    """Ask for a reconcile pass soon. Never raises: a lost wake costs one ticker period."""
    metrics.RECONCILE_WAKES.labels("asked").inc()
    try:
        # The claim and the queued task in one transaction: one commit, not two, and inside
        # it django-q2's ORM broker leaves the caller's connection alone (in autocommit it
        # closes an aged one before each enqueue, the webhook writer's kept one included).
        with transaction.atomic():
            if not _claim_wake():
                return  # a pass is already queued and has not started: it will see this change
            from django_q.tasks import async_task  # noqa: PLC0415  # django-q2's models need the apps loaded

            def enqueue() -> None:
                # No result row for a woken pass that succeeds: under load they run back to
                # back, each row a write (and a prune) against the webhook writer's lock, and
                # they pushed every other task out of the 200 kept. Failures are still saved.
                async_task(
                    "runners.tasks.reconcile_task",
                    group="reconcile",
                    q_options={"timeout": 300, "save": False},
                )

            if settings.Q_CLUSTER.get("orm"):
                enqueue()  # the ORM broker's row commits with the claim
            else:
                # A Redis queue is not in the transaction: the task must not start before
                # the claim it clears has committed.
                transaction.on_commit(enqueue)
        metrics.RECONCILE_WAKES.labels("enqueued").inc()
    except Exception as exc:  # a wake must never fail the request that asked for it
        _faults.failed(exc)
    else:
        _faults.worked()
