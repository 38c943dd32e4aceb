"""The Overview statistics (EVT-06): counts worked out from the rows, never stored."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count

from fleet.models import Host
from fleet.states import HostHealth
from runners.models import Job, Runner
from runners.states import LIVE_STATES, JobStatus, RunnerState

# The chart's window and its bucket width; 12 buckets of 5 minutes fill the hour.
WINDOW = timedelta(hours=1)
BUCKET = timedelta(minutes=5)


def overview(now: datetime) -> dict:
    """Queued jobs, runners by state, hosts by health, and the last hour's queue times.

    `queue_time` holds one point per bucket (seconds, the longest wait of the jobs that
    started in it, or null when none did), oldest first: the Overview's small chart.
    """
    by_state = dict(
        Runner.objects.filter(state__in=list(LIVE_STATES))
        .values_list("state")
        .annotate(n=Count("pk"))
        .values_list("state", "n")
    )
    by_health = dict(
        Host.objects.values_list("health").annotate(n=Count("pk")).values_list("health", "n")
    )
    since = now - WINDOW
    started = Job.objects.filter(started_at__gte=since, started_at__lte=now).values_list(
        "created_at", "started_at"
    )
    buckets: list[float | None] = [None] * int(WINDOW / BUCKET)
    waits = []
    for created, began in started:
        wait = max((began - created).total_seconds(), 0.0)
        waits.append(wait)
        i = min(int((began - since) / BUCKET), len(buckets) - 1)
        buckets[i] = max(buckets[i] or 0.0, wait)
    return {
        "queued_jobs": Job.objects.filter(status=JobStatus.QUEUED).count(),
        "runners_by_state": {s: by_state.get(s, 0) for s in RunnerState.values if s in LIVE_STATES},
        "hosts_by_health": {h: by_health.get(h, 0) for h in HostHealth.values},
        "cordoned_hosts": Host.objects.filter(cordoned=True).count(),
        "queue_time": {
            "bucket_seconds": int(BUCKET.total_seconds()),
            "points": buckets,
            "jobs_started": len(waits),
            "max_seconds": max(waits, default=None),
        },
    }
