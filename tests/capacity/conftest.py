"""Fixtures for the capacity layer: a pool with queued work, a receiver, a moved clock."""

from __future__ import annotations

import dataclasses
import secrets
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from capacity.config import load
from capacity.delivery import deliver
from capacity.loop import step
from fleet.models import Host
from runners.models import Job, Pool
from runners.states import JobStatus
from tests.capacity.receiver import MovableClock, ScriptedReceiver

SECRET = secrets.token_hex(32)


@pytest.fixture
def clock():
    return MovableClock(datetime(2026, 9, 5, 12, 0, tzinfo=UTC))


@pytest.fixture
def receiver(tmp_path, clock):
    r = ScriptedReceiver(SECRET, str(tmp_path / "receiver.db"), clock)
    yield r
    r.stop()


@pytest.fixture
def config(registry_defaults, receiver):
    return dataclasses.replace(
        load(),
        destination_url=receiver.url,
        signing_secret=SECRET,
        timeout=timedelta(seconds=5),
    )


class Loop:
    """`step` with the test's clock and an inline dispatch: each due try is made at once."""

    def __init__(self, clock, config):
        self.clock = clock
        self.config = config

    def step(self, **advance):
        if advance:
            self.clock.advance(**advance)
        return step(
            self.clock.now,
            dispatch=lambda attempt_id: deliver(attempt_id, clock=self.clock, config=self.config),
            config=self.config,
        )


@pytest.fixture
def loop(clock, config):
    return Loop(clock, config)


def make_pool(name="zoomies-linux-x64", **kw) -> Pool:
    kw.setdefault("labels", ["linux-x64"])
    kw.setdefault("platform", "linux/x64")
    kw.setdefault("backend", "docker")
    return Pool.objects.create(name=name, **kw)


_job_ids = iter(range(1, 10**6))


def queue_jobs(n: int, *, at: datetime, labels=("self-hosted", "linux-x64")) -> list[Job]:
    return [
        Job.objects.create(
            github_id=100_000 + next(_job_ids),
            repository="octo/app",
            labels=list(labels),
            status=JobStatus.QUEUED,
            created_at=at,
            updated_at=at,
        )
        for _ in range(n)
    ]


def make_host(name="zoomies-host-1", **kw) -> Host:
    kw.setdefault("capacity", 2)
    kw.setdefault("backends", ["docker"])
    kw.setdefault("platform", "linux/x64")
    kw.setdefault("last_heartbeat_at", timezone.now())
    return Host.objects.create(name=name, **kw)
