"""Jobs only move forward, whatever order the updates arrive in (HOOK-03)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from runners.actions import JobUpdate, record_job
from runners.models import Job

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
STATUSES = ["queued", "in_progress", "completed"]


@pytest.mark.django_db
@pytest.mark.parametrize("order", list(itertools.permutations(STATUSES)))
def test_hook03_every_permutation_leaves_the_job_completed(order):
    for i, status in enumerate(order):
        update = JobUpdate(
            github_id=42,
            status=status,
            repository="acme/app",
            labels=("self-hosted", "linux"),
            conclusion="success" if status == "completed" else "",
        )
        record_job(
            update,
            installation=None,
            now=T0 + timedelta(seconds=i),
            source="webhook",
            actor="test",
        )
    job = Job.objects.get(github_id=42)
    assert job.status == "completed"
    assert job.conclusion == "success"


@pytest.mark.django_db
@pytest.mark.parametrize("order", list(itertools.permutations(STATUSES)))
def test_hook03_the_status_never_decreases_along_the_way(order):
    rank = {"queued": 0, "in_progress": 1, "completed": 2}
    seen = []
    for status in order:
        record_job(
            JobUpdate(github_id=7, status=status, repository="acme/app"),
            installation=None,
            now=T0,
            source="poll",
            actor="test",
        )
        seen.append(rank[Job.objects.get(github_id=7).status])
    assert seen == sorted(seen)


@pytest.mark.django_db
def test_a_waiting_job_may_become_queued_again():
    """GitHub sends queued, waiting, queued for an environment-gated job."""
    for status in ["queued", "waiting", "queued"]:
        record_job(
            JobUpdate(github_id=9, status=status, repository="acme/app"),
            installation=None,
            now=T0,
            source="webhook",
            actor="test",
        )
    assert Job.objects.get(github_id=9).status == "queued"
