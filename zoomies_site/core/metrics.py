"""The controller's Prometheus counters and histograms (issue 10 item 9); `GET /metrics`
serves them with the database gauges (zoomies_site/metrics_view.py).

Two kinds of series:

- counters and histograms incremented where things happen (webhook ingest, the GitHub
  client, the reconcile pass, job starts, stand-downs, and the capacity layer's own in
  capacity/metrics.py). The controller runs the web server and the workers as separate
  processes, so it sets PROMETHEUS_MULTIPROC_DIR (cleared at each start) and each process
  writes its values there; a scrape adds them up.
- gauges of what the database holds now (jobs by status, runners by state and pool, hosts
  by health, open agent tasks, the django-q2 queue, installations standing down), worked out
  at scrape time by `DatabaseCollector` with a handful of GROUP BY queries.

A scrape needs a viewer's session or a token with fleet:read (authentication is on by
default, SEC-02): Prometheus sends it with `authorization: {credentials: zpt_...}`.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import (
    Counter,
    Histogram,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

WEBHOOK_DELIVERIES = Counter(
    "zoomies_webhook_deliveries_total",
    "GitHub webhook deliveries by outcome (accepted, duplicate, bad_signature, invalid, ...).",
    ["outcome"],
)
GITHUB_CALLS = Counter(
    "zoomies_github_api_calls_total",
    "GitHub API calls by method, route (ids replaced) and status (transport_error: no answer).",
    ["method", "route", "status"],
)
STANDDOWNS = Counter(
    "zoomies_github_rate_limit_standdowns_total",
    "Times an installation stood down because GitHub rate limited it, by what was calling.",
    ["by"],
)
RECONCILE_WAKES = Counter(
    "zoomies_reconcile_wakes_total",
    "Requests to wake the reconcile pass (asked) and the passes they enqueued (enqueued): "
    "a burst of webhooks asks many times and enqueues about once.",
    ["outcome"],
)
RECONCILE_SECONDS = Histogram(
    "zoomies_reconcile_pass_seconds",
    "How long one reconcile pass (snapshot, decide, apply) took.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_SECONDS = Histogram(
    "zoomies_job_queue_seconds",
    "Time from a job being queued at GitHub to it starting on a runner.",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
)


def webhook_delivery(status: int, body: dict[str, Any]) -> None:
    WEBHOOK_DELIVERIES.labels(outcome=webhook_outcome(status, body)).inc()


def webhook_outcome(status: int, body: dict[str, Any]) -> str:
    if status == 200:
        if body.get("ignored"):
            return "ignored"  # recorded, but for an installation not configured here
        return "duplicate" if body.get("duplicate") else "accepted"
    named = {401: "bad_signature", 413: "too_large", 408: "timeout", 503: "busy"}
    return named.get(status, "invalid")


# Segments after these name an account or repository: replaced so the label set stays small.
_NAMED_AFTER = {
    "repos": ("{owner}", "{repo}"),
    "orgs": ("{org}",),
    "users": ("{user}",),
    "enterprises": ("{enterprise}",),
}


def github_route(path: str) -> str:
    """`/repos/o/r/actions/runs/5/jobs` -> `/repos/{owner}/{repo}/actions/runs/{id}/jobs`."""
    out: list[str] = []
    names: list[str] = []
    for part in path.split("/"):
        if names:
            out.append(names.pop(0))
        elif part.isdigit():
            out.append("{id}")
        else:
            out.append(part)
            names = list(_NAMED_AFTER.get(part, ()))
    return "/".join(out)


def github_call(method: str, path: str, status: int | None) -> None:
    GITHUB_CALLS.labels(
        method=method,
        route=github_route(path),
        status=str(status) if status is not None else "transport_error",
    ).inc()


def standdown(by: str) -> None:
    STANDDOWNS.labels(by=by).inc()


def job_started(created_at: datetime | None, started_at: datetime | None) -> None:
    """A job's queue time, observed once when it moves to in_progress."""
    if created_at is not None and started_at is not None:
        QUEUE_SECONDS.observe(max(0.0, (started_at - created_at).total_seconds()))


def clear_multiproc_dir(path: str | Path) -> None:
    """Empty the directory (made if missing): a restarted controller starts its counts at zero
    rather than adding the dead processes' files to the new ones'."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for child in directory.glob("*.db"):
        child.unlink(missing_ok=True)


# manage.py's name for the directory a starting controller counts into before it knows its
# data directory (manage.py cannot import this module that early: it imports the library).
STARTUP_DIR_PREFIX = "zoomies-controller-metrics-"


def remove_startup_dir(path: str | None) -> None:
    """Remove manage.py's startup directory, and nothing an operator named."""
    if not path:
        return
    directory = Path(path)
    if directory.name.startswith(STARTUP_DIR_PREFIX) and directory.parent == Path(
        tempfile.gettempdir()
    ):
        shutil.rmtree(directory, ignore_errors=True)
