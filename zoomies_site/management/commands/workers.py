"""`python manage.py workers`: the background tier alone, for scale-out (issue 26 item 4).

The django-q2 cluster (a child program tied to this process) and the ticker that enqueues
the periodic passes. Any number of these run beside `manage.py web` on PostgreSQL and
Redis; the ticker runs in one of them at a time, the holder of the "ticker" lease row, and
every loop that must run once (reconcile, poll, reap, machines, capacity) is held by its own
lease as always. A holder killed with SIGKILL is replaced once its lease runs out.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from datetime import timedelta

from django.core.management.base import BaseCommand
from django.db import DatabaseError, connection
from django.utils import timezone

from zoomies_site.core import leases
from zoomies_site.core.forked import arm_parent_death_signal
from zoomies_site.ticker import default_ticker

log = logging.getLogger("zoomies.workers")

TICKER_LEASE = "ticker"
# Long enough to ride out a slow round, short enough that a killed holder is replaced soon.
TICKER_TTL = timedelta(seconds=15)
TICK_EVERY = 0.5
STOP_TIMEOUT = 15


class Command(BaseCommand):
    help = "Run the background tier alone (scale-out): the django-q2 cluster and the ticker."

    def handle(self, *args, **options):
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        signal.signal(signal.SIGINT, lambda *_: stopping.set())
        parent = os.getpid()
        # Started before any thread of ours: the child's parent-death signal is armed
        # between its fork and its exec, then checked again in the child itself.
        cluster = subprocess.Popen(
            [sys.executable, "-m", "zoomies_site.cluster_child", str(parent)],
            preexec_fn=arm_parent_death_signal,
            process_group=0,  # a signal to this group is this process's to pass on
        )
        holder = f"{socket.gethostname()}:{parent}:{secrets.token_hex(4)}"
        ticker = default_ticker(timezone.now())
        held = False
        self.stdout.write(f"workers: cluster pid {cluster.pid}; ticker lease holder {holder}")
        try:
            while not stopping.is_set() and cluster.poll() is None:
                try:
                    now = timezone.now()
                    mine = leases.acquire(TICKER_LEASE, holder=holder, now=now, ttl=TICKER_TTL)
                    if mine != held:
                        log.info("workers: the ticker %s", "is ours" if mine else "is elsewhere")
                        held = mine
                    if mine:
                        ticker.step(now)
                except DatabaseError as exc:
                    log.warning("workers: ticker round skipped: %s", exc)
                    connection.close()
                stopping.wait(TICK_EVERY)
        finally:
            if held:
                try:
                    leases.release(TICKER_LEASE, holder=holder, force=True)
                except DatabaseError:
                    pass  # it expires by itself
            if cluster.poll() is None:
                cluster.terminate()
            try:
                cluster.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.warning("workers: the cluster did not stop within %d s: killed", STOP_TIMEOUT)
                cluster.kill()
                cluster.wait(5)
        if cluster.returncode not in (0, -signal.SIGTERM) and not stopping.is_set():
            raise SystemExit(f"workers: the cluster exited with {cluster.returncode}")
