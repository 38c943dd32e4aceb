"""GitHub's job objects read as `JobUpdate`s: a webhook delivery's `workflow_job` and an
item of the REST jobs list the poller reads (runners.webhooks, runners.poller), checked the
same way, so both sources feed `runners.actions.apply_job_update` alike. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from runners.actions import JobUpdate, normalise_status
from runners.states import JobStatus

# GitHub's ids are positive and fit a BIGINT; anything larger cannot be a row of ours.
MAX_ID = 2**63 - 1
# A timestamp outside these years is not one of GitHub's, and is dropped (see below).
EARLIEST_YEAR, LATEST_YEAR = 1970, 9998


class BadPayload(ValueError):
    """The body is not a delivery we can act on; answered 400 and nothing is recorded."""


def parse_github_datetime(value: Any) -> datetime | None:
    """A GitHub timestamp as an aware datetime: ISO 8601 text, or epoch seconds (older
    `installation` payloads carry integers where GitHub's schema says date-time strings).

    Anything else is treated as absent rather than refusing the delivery over a timestamp:
    so is a time we cannot place (1e300, -1e20, NaN, year 9999 west of UTC), which no
    database column could hold either.
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            parsed = datetime.fromtimestamp(value, UTC)
        elif isinstance(value, str) and value:
            parsed = datetime.fromisoformat(value)
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            parsed = parsed.astimezone(UTC)
        else:
            return None
    except (ValueError, OverflowError, OSError):
        return None
    return parsed if EARLIEST_YEAR <= parsed.year <= LATEST_YEAR else None


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def checked_github_id(value: Any, what: str) -> int | None:
    """A GitHub id (positive, within a BIGINT column), None when absent; BadPayload if not."""
    if value is None:
        return None
    found = int_or_none(value)
    if found is None or not 0 < found <= MAX_ID:
        raise BadPayload(f"{what} is not an id GitHub issues (a positive 64-bit integer)")
    return found


def storable(value: str) -> bool:
    """False for text no database column takes: NUL, or a lone surrogate from a JSON escape."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def checked_text(value: Any, what: str, max_length: int) -> str:
    """A string we store: "" when absent or not a string; BadPayload when it cannot be kept.

    GitHub never sends a NUL character or a repository name longer than 140 characters,
    and PostgreSQL refuses NUL in text, so such a field refuses the delivery rather than
    being cut (a cut runner name would link the wrong runner).
    """
    if not isinstance(value, str):
        return ""
    if not storable(value):
        raise BadPayload(f"{what} contains a NUL character or a lone surrogate (\\ud800)")
    if len(value) > max_length:
        raise BadPayload(f"{what} is longer than {max_length} characters")
    return value


def job_update_from_github(
    job: Mapping[str, Any], *, repository: str, status: str | None = None
) -> JobUpdate:
    """GitHub's job object as a `JobUpdate`; BadPayload when a field we need is missing.

    `status` overrides `job["status"]` (a delivery's action, see STATUS_ACTIONS). The runner
    name is kept only once the job has started: GitHub's own example of a queued job already
    names a runner, and a job is linked to a runner only from in_progress: any idle
    runner whose labels match may take a queued job, not the one made for it.
    """
    if job.get("id") is None:
        raise BadPayload("workflow_job.id is missing or not an integer")
    github_id = checked_github_id(job.get("id"), "workflow_job.id")
    if not isinstance(repository, str) or "/" not in repository:
        raise BadPayload("repository.full_name is missing")
    repository = checked_text(repository, "repository.full_name", 200)
    raw_status = status or job.get("status")
    if not isinstance(raw_status, str) or not raw_status:
        raise BadPayload("workflow_job.status is missing")
    labels = job.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise BadPayload("workflow_job.labels is not a list of strings")
    for label in labels:
        checked_text(label, "a workflow_job label", 1000)
    normalised = normalise_status(raw_status)
    started = normalised in (JobStatus.IN_PROGRESS, JobStatus.COMPLETED)
    runner_name = checked_text(job.get("runner_name"), "workflow_job.runner_name", 200)
    name = job.get("name")
    return JobUpdate(
        github_id=github_id,
        status=raw_status,
        repository=repository,
        labels=tuple(labels),
        run_id=checked_github_id(job.get("run_id"), "workflow_job.run_id"),
        name=checked_text(name[:300] if isinstance(name, str) else "", "workflow_job.name", 300),
        conclusion=checked_text(job.get("conclusion"), "workflow_job.conclusion", 32),
        runner_name=runner_name if started else "",
        created_at=parse_github_datetime(job.get("created_at")),
        started_at=parse_github_datetime(job.get("started_at")) if started else None,
        completed_at=parse_github_datetime(job.get("completed_at")),
    )
