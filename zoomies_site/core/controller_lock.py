"""One controller per database (spec "One controller per database", LEASE-01..07).

Two things are taken before anything starts, migrations included (ARCH-03): an advisory
file lock beside the database (the kernel drops it however the process exits, SIGKILL
included) and a lease row in the database (which catches a controller on another host
pointed at the same data). A database that has never been migrated has no lease table yet:
then the file lock alone comes first, and the lease is taken right after the first migrate.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.models import Q

from zoomies_site.core.models import Lease

LEASE_NAME = "controller"


class ControllerRefused(Exception):
    """Another controller holds the lock or the lease; the message names it."""


def lock_path() -> Path:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return Path(str(db["NAME"]) + ".lock")
    return Path(settings.DATA_DIR) / "controller.lock"


def identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class ControllerLock:
    """The file lock and the lease row, held for the controller's life."""

    path: Path
    fd: int
    holder: str
    leased: bool = False

    def take_lease(self, *, now: datetime, ttl: timedelta, takeover: bool = False) -> None:
        take_lease(holder=self.holder, now=now, ttl=ttl, takeover=takeover)
        self.leased = True

    def release(self) -> None:
        try:
            if self.leased:
                Lease.objects.filter(name=LEASE_NAME, holder=self.holder).update(
                    holder="", expires_at=None
                )
        finally:
            self._unlock()

    def _unlock(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


def take_file_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            who = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            who = {}
        os.close(fd)
        raise ControllerRefused(
            f"another controller holds {path} (host {who.get('host', '?')}, "
            f"pid {who.get('pid', '?')}); stop it first"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode(), 0)
    return fd


def take_lease(*, holder: str, now: datetime, ttl: timedelta, takeover: bool) -> None:
    """Take the controller lease row, or say who holds it.

    Holding the file lock proves no other controller on this host has the database, so a
    lease left by this host's predecessor is reclaimed at once (LEASE-06).
    """
    Lease.objects.get_or_create(name=LEASE_NAME)
    this_host = socket.gethostname()
    free = Q(holder="") | Q(expires_at__lt=now) | Q(holder__startswith=f"{this_host}:")
    query = Lease.objects.filter(name=LEASE_NAME)
    if not takeover:
        query = query.filter(free)
    if query.update(holder=holder, expires_at=now + ttl, acquired_at=now, dirty=False):
        Lease.objects.filter(name=LOST_MARK).delete()
        return
    current = Lease.objects.get(name=LEASE_NAME)
    host, _, pid = current.holder.partition(":")
    raise ControllerRefused(
        f"the controller lease is held by host {host}, pid {pid}, until "
        f"{current.expires_at:%Y-%m-%d %H:%M:%S}Z; if that controller is gone, "
        "start with --takeover"
    )


LOST_MARK = "controller.lease_lost"


def record_lease_lost(*, holder: str, now: datetime) -> None:
    """Leave the mark the problems list reads; only a fresh acquire clears it."""
    Lease.objects.update_or_create(
        name=LOST_MARK, defaults={"holder": holder, "acquired_at": now, "expires_at": None}
    )


def controller_started_at() -> datetime | None:
    """When the running controller took its lease (its start); None before any did."""
    return Lease.objects.filter(name=LEASE_NAME).values_list("acquired_at", flat=True).first()


def lease_lost_since() -> datetime | None:
    return Lease.objects.filter(name=LOST_MARK).values_list("acquired_at", flat=True).first()


def renew_lease(*, holder: str, now: datetime, ttl: timedelta) -> bool:
    """False means somebody else holds the lease now (controller.lease_lost, LEASE-07)."""
    return bool(Lease.objects.filter(name=LEASE_NAME, holder=holder).update(expires_at=now + ttl))


def lease_table_exists() -> bool:
    """Whether the database has been migrated far enough to hold the lease row."""
    return Lease._meta.db_table in connection.introspection.table_names()


def acquire(
    *, now: datetime, ttl: timedelta, takeover: bool = False, lease: bool = True
) -> ControllerLock:
    """The file lock, then (with `lease`) the lease row; ControllerRefused names the holder."""
    path = lock_path()
    fd = take_file_lock(path)
    lock = ControllerLock(path=path, fd=fd, holder=identity())
    if lease:
        try:
            lock.take_lease(now=now, ttl=ttl, takeover=takeover)
        except BaseException:
            os.close(fd)
            raise
    return lock
