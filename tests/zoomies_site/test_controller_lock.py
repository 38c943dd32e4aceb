"""One controller per database: the file lock and the lease row (LEASE-01..07)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from zoomies_site.core import controller_lock
from zoomies_site.core.controller_lock import ControllerRefused
from zoomies_site.core.models import Lease
from zoomies_site.problems import problems

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=30)


@pytest.fixture
def lock_file(tmp_path, monkeypatch):
    path = tmp_path / "zoomies.db.lock"
    monkeypatch.setattr(controller_lock, "lock_path", lambda: path)
    return path


@pytest.mark.django_db
def test_lease01_a_second_controller_on_the_same_host_is_refused_by_the_file_lock(lock_file):
    first = controller_lock.acquire(now=T0, ttl=TTL)
    try:
        with pytest.raises(ControllerRefused) as refused:
            controller_lock.acquire(now=T0, ttl=TTL, takeover=True)
        # LEASE-04: the refusal names who holds it.
        assert socket.gethostname() in str(refused.value)
        assert "pid" in str(refused.value)
    finally:
        first.release()


@pytest.mark.django_db
def test_lease02_the_kernel_drops_the_lock_of_a_killed_holder(lock_file):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(lock_file)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ControllerRefused):
        controller_lock.take_file_lock(lock_file)
    holder.kill()
    holder.wait(timeout=10)
    deadline = time.monotonic() + 5
    while True:
        try:
            fd = controller_lock.take_file_lock(lock_file)
            break
        except ControllerRefused:
            assert time.monotonic() < deadline
            time.sleep(0.05)

    os.close(fd)


@pytest.mark.django_db
def test_lease03_lease04_a_lease_held_from_another_host_is_refused_and_named(lock_file):
    Lease.objects.create(
        name="controller", holder="build-7:4242", expires_at=T0 + timedelta(seconds=20)
    )
    with pytest.raises(ControllerRefused) as refused:
        controller_lock.acquire(now=T0, ttl=TTL)
    assert "build-7" in str(refused.value) and "4242" in str(refused.value)
    assert "--takeover" in str(refused.value)


@pytest.mark.django_db
def test_lease03_an_expired_lease_from_another_host_is_taken(lock_file):
    Lease.objects.create(
        name="controller", holder="build-7:4242", expires_at=T0 - timedelta(seconds=1)
    )
    lock = controller_lock.acquire(now=T0, ttl=TTL)
    try:
        assert Lease.objects.get(name="controller").holder == lock.holder
    finally:
        lock.release()


@pytest.mark.django_db
def test_lease05_takeover_starts_despite_a_lease_held_elsewhere(lock_file):
    Lease.objects.create(
        name="controller", holder="build-7:4242", expires_at=T0 + timedelta(minutes=5)
    )
    lock = controller_lock.acquire(now=T0, ttl=TTL, takeover=True)
    try:
        assert Lease.objects.get(name="controller").holder == lock.holder
    finally:
        lock.release()


@pytest.mark.django_db
def test_lease06_a_restart_on_the_same_host_reclaims_the_lease_at_once(lock_file):
    Lease.objects.create(
        name="controller",
        holder=f"{socket.gethostname()}:99999",
        expires_at=T0 + timedelta(minutes=5),
    )
    lock = controller_lock.acquire(now=T0, ttl=TTL)
    try:
        assert Lease.objects.get(name="controller").holder == lock.holder
    finally:
        lock.release()


@pytest.mark.django_db
def test_lease07_a_renewal_that_finds_another_holder_says_so(lock_file):
    """LEASE-07, EVT-07: the lost lease is a problem under controller.lease_lost."""
    lock = controller_lock.acquire(now=T0, ttl=TTL)
    try:
        assert controller_lock.renew_lease(holder=lock.holder, now=T0, ttl=TTL)
        Lease.objects.filter(name="controller").update(holder="build-7:4242")
        assert not controller_lock.renew_lease(holder=lock.holder, now=T0, ttl=TTL)
        controller_lock.record_lease_lost(holder=lock.holder, now=T0)
        keys = {p["key"] for p in problems(T0)}
        assert "controller.lease_lost" in keys
    finally:
        lock.release()
