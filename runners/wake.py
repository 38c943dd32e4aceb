"""Waking the reconcile pass at once (HOOK-04), coalesced.

A burst of webhooks must not become a burst of reconcile passes, nor a burst of writes. A
wake is sent once per transaction, after its commit (so the pass sees what woke it), on the
wake bus (`zoomies_site.core.wakebus`, topic RECONCILE) to the pass loop of the running
controller or workers (`runners.pass_loop`): no row is written for it at all, where the task
queue cost a flag and a queued row inside the webhook writer's transaction and three more
writes around each pass, every one of them a wait on SQLite's write lock (docs/performance.md,
2026-12-06). The loop's socket buffers the wakes that arrive during a pass, and its next
wait takes them all and runs one pass: coalesced, and none lost while it lives.

With no loop listening (a command or test outside the controller, a controller that has not
started it yet), the wake falls back to the task queue, coalesced by a flag: only the wake
that turned it on enqueues a task, and the task clears it before its pass, so a wake during
the pass enqueues one more. Either way a wake is a hint: one lost with its process costs at
most one ticker period (`scheduler.reconcile_interval`), whose passes stay on the queue.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from zoomies_site.core import metrics, wakebus
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
    """Ask for a reconcile pass soon, once the current transaction commits. Never raises:
    a lost wake costs one ticker period."""
    metrics.RECONCILE_WAKES.labels("asked").inc()
    try:
        wakebus.on_commit_once(_signal_or_enqueue)
    except Exception as exc:  # a wake must never fail the request that asked for it
        _faults.failed(exc)


def _signal_or_enqueue() -> None:
    """After the commit: wake the pass loops; with none listening, queue a task."""
    try:
        if wakebus.notify(wakebus.RECONCILE):
            metrics.RECONCILE_WAKES.labels("signalled").inc()
        else:
            enqueue_pass()
    except Exception as exc:  # runs in the committer's thread, after its commit
        _faults.failed(exc)
    else:
        _faults.worked()


def enqueue_pass() -> None:
    """A reconcile pass on the task queue, unless one is queued and has not started."""
    # The claim and the queued task in one transaction: one commit, not two, and inside it
    # django-q2's ORM broker leaves the caller's connection alone (in autocommit it closes
    # an aged one before each enqueue, the webhook writer's kept one included).
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
