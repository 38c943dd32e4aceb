"""What a restarted controller takes over from its killed predecessor (issue 11 item 3).

Called once the controller holds the file lock beside the database, which proves no other
controller on this host is running. Whatever the previous process (and its workers, and its
embedded agent thread) still held is therefore dead, and waiting for its leases to expire
would stall the restart for minutes: the reconcile lease for five, a create task for twenty.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from datetime import datetime

from fleet.models import Host
from fleet.taskqueue import requeue_in_flight
from runners.actions.lifecycle import settle_abandoned_tasks
from zoomies_site.core import controller_lock, leases

log = logging.getLogger("zoomies.controller")

ACTOR = "system:controller"


def recover_after_restart(
    *,
    now: datetime,
    embedded_host: str | None,
    host: str | None = None,
    alive: Callable[[int], bool] = leases.pid_alive,
) -> list[str]:
    """Free the dead process's leases and offer its embedded agent's tasks again; one line
    per thing done. `embedded_host` is the embedded agent's host name: that agent ran as a
    thread of the dead controller, so what it had in flight will never be answered."""

    lines = [
        f"lease {name}: freed, its holder died with the previous controller"
        for name in leases.take_over_dead_holders(
            host=host or socket.gethostname(),
            keep=(controller_lock.LEASE_NAME, controller_lock.LOST_MARK),
            alive=alive,
        )
    ]
    host_id = (
        Host.objects.filter(name=embedded_host).values_list("pk", flat=True).first()
        if embedded_host
        else None
    )
    if host_id is not None:
        result = requeue_in_flight(
            host_id, now=now, actor=ACTOR, why="its agent died with the previous controller"
        )
        lines += result.lines + settle_abandoned_tasks(result.abandoned, now=now)
    for line in lines:
        log.info("recovery: %s", line)
    return lines


class DeadGeneration:
    """Leases on this host held, at the restart, by processes that still ran: the killed
    controller's workers, which die a moment after it (their parent-death signal) or are
    stuck in the kernel a while longer. The restart's recovery could not free them yet, and
    waiting for their expiry stalled scheduling for minutes (issue 21 item 17). `step()`
    frees each once its holder is gone, and says whether any is still waited for; the
    controller's loop calls it until then, and stops after `controller.lease_ttl` (when the
    leases have expired anyway)."""

    def __init__(
        self, *, host: str | None = None, alive: Callable[[int], bool] = leases.pid_alive
    ) -> None:
        self.host = host or socket.gethostname()
        self.alive = alive
        self.keep = (controller_lock.LEASE_NAME, controller_lock.LOST_MARK)
        self.pending = leases.held_by_live_processes(host=self.host, keep=self.keep, alive=alive)
        for name, holder in sorted(self.pending):
            log.info("recovery: lease %s still held by %s, which still runs: waiting", name, holder)

    def step(self) -> bool:
        if not self.pending:
            return False
        for name in leases.take_over_dead_holders(host=self.host, keep=self.keep, alive=self.alive):
            log.info(
                "recovery: lease %s: freed, its holder died with the previous controller", name
            )
        self.pending = leases.still_held(self.pending)
        return bool(self.pending)
