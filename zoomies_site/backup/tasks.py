"""The scheduled backup, run by django-q2 when the controller's ticker enqueues it."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import timedelta

from django.utils import timezone

from zoomies_site.backup import service
from zoomies_site.core import leases, registry

log = logging.getLogger("zoomies.backup")
LEASE = "backup.scheduled"


def backup_task() -> dict | None:
    """One round of the schedule; a lease keeps two workers from taking the same copy."""
    now = timezone.now()
    # A token too: the task cluster's workers are threads of one process, which must not
    # take each other's lease for their own.
    holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    if not leases.acquire(LEASE, holder=holder, now=now, ttl=timedelta(hours=1)):
        return None
    try:
        outcome = service.scheduled(now)
    finally:
        leases.release(LEASE, holder=holder, force=True)
    if outcome["took"]:
        log.info("scheduled backup %s taken (%s)", outcome["took"], outcome["why"])
    for name in outcome["pruned"]:
        log.info("retention removed backup %s", name)
    for error in outcome["errors"]:
        log.error("scheduled backup: %s", error)
    return outcome


def requested_backup_task(actor: str, upload: bool) -> dict:
    """A backup an administrator asked for through the API (or the Settings page): encrypted
    with backup.passphrase when set, copied to backup.remotes when asked."""
    try:
        taken = service.take(
            actor=actor,
            passphrase=registry.get("backup.passphrase"),
            remotes=registry.get("backup.remotes") if upload else [],
        )
    except service.BackupError as exc:
        log.error("backup asked for by %s: %s", actor, exc)
        return {"ok": False, "error": str(exc)}
    log.info("backup %s taken for %s", taken.manifest["file"], actor)
    return {"ok": True, "file": taken.manifest["file"], "uploaded": taken.uploaded}
