"""Reads for the capacity API: the last attempts with their tries, spawns, failures, waits."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Prefetch

from capacity.config import load
from capacity.models import Attempt, ProvisionFailures, Spawn, Try
from capacity.planner import plan
from capacity.snapshot import build

RECENT_ATTEMPTS = 100
RECENT_SPAWNS = 50


def recent_attempts():
    return (
        Attempt.objects.order_by("-started_at", "-pk")
        .prefetch_related(Prefetch("try_rows", queryset=Try.objects.order_by("number")))
        .select_related("pool")[:RECENT_ATTEMPTS]
    )


def recent_spawns():
    return Spawn.objects.select_related("attempt", "pool", "host").order_by("-created_at", "-pk")[
        :RECENT_SPAWNS
    ]


def provision_failures():
    return ProvisionFailures.objects.order_by("destination_url")


def pool_waits(now: datetime) -> tuple[bool, list[dict]]:
    """Whether events are published, and what each pool waits for, planned afresh (no writes)."""
    config = load()
    decided = plan(build(now, config))
    return config.enabled, [
        {"pool_id": s.pool_id, "pool_name": s.pool_name, "waiting_for": s.waiting_for}
        for s in decided.statuses
    ]
