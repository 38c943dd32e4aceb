"""GitHub webhook ingest (spec "A job arrives" steps 1-2; HOOK-01..07).

`ingest` is everything `POST /webhooks/github` does, minus HTTP: verify the signature over
the raw body, parse, record the delivery and apply the job update in one transaction, and
wake the reconcile pass after the commit. It makes no GitHub call and schedules nothing
itself (HOOK-04): the answer goes back as soon as the rows are written, because GitHub
gives a delivery 10 s and never retries a failed one on its own (PEERS.md point 1).

`job_update_from_github` turns GitHub's job object (a delivery's `workflow_job`, or an item
of the REST jobs list the poller reads) into a `JobUpdate`, so both sources feed
`runners.actions.apply_job_update` the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from accounts import audit
from runners.actions import JobUpdate, apply_job_update, normalise_status
from runners.models import Installation, WebhookDelivery
from runners.states import JobStatus

log = logging.getLogger("zoomies.webhooks")

ACTOR = "github:webhook"
SIGNATURE_PREFIX = "sha256="
# The actions that name a job status outright. GitHub can send action "queued" with status
# "waiting" (NOTES.md section 1), so for these the action wins over workflow_job.status.
STATUS_ACTIONS = frozenset(
    {JobStatus.QUEUED, JobStatus.IN_PROGRESS, JobStatus.COMPLETED, JobStatus.WAITING}
)


class BadPayload(ValueError):
    """The body is not a delivery we can act on; answered 400 and nothing is recorded."""


@dataclass(frozen=True)
class Outcome:
    """What the endpoint answers: an HTTP status and a JSON body."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)


# -- the signature (HOOK-01) ---------------------------------------------------------------


def sign(body: bytes, secret: str) -> str:
    """`sha256=<hex>`: GitHub's X-Hub-Signature-256 for `body` under `secret`."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def signature_matches(body: bytes, header: str | None, secrets: Iterable[str]) -> bool:
    """True when `header` is a valid signature of the raw `body` under any of `secrets`.

    Every secret is tried with a constant-time compare, so a rotation can list the old and
    the new secret side by side.
    """
    if not header or not header.startswith(SIGNATURE_PREFIX):
        return False
    given = header.strip().lower().encode("ascii", "replace")
    matched = False
    for secret in secrets:
        if secret and hmac.compare_digest(sign(body, secret).encode("ascii"), given):
            matched = True  # keep going: the time taken does not depend on which one matched
    return matched


# -- parsing -------------------------------------------------------------------------------


def parse_github_datetime(value: Any) -> datetime | None:
    """A GitHub timestamp as an aware datetime: ISO 8601 text, or epoch seconds (NOTES.md 6).

    Anything else is treated as absent rather than refusing the delivery over a timestamp.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def job_update_from_github(
    job: Mapping[str, Any], *, repository: str, status: str | None = None
) -> JobUpdate:
    """GitHub's job object as a `JobUpdate`; BadPayload when a field we need is missing.

    `status` overrides `job["status"]` (a delivery's action, see STATUS_ACTIONS). The runner
    name is kept only once the job has started: GitHub's own example of a queued job already
    names a runner, and a job is linked to a runner only from in_progress (PEERS.md point 2).
    """
    github_id = _int_or_none(job.get("id"))
    if github_id is None:
        raise BadPayload("workflow_job.id is missing or not an integer")
    if not isinstance(repository, str) or "/" not in repository:
        raise BadPayload("repository.full_name is missing")
    raw_status = status or job.get("status")
    if not isinstance(raw_status, str) or not raw_status:
        raise BadPayload("workflow_job.status is missing")
    labels = job.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise BadPayload("workflow_job.labels is not a list of strings")
    normalised = normalise_status(raw_status)
    started = normalised in (JobStatus.IN_PROGRESS, JobStatus.COMPLETED)
    runner_name = job.get("runner_name") if started else None
    name = job.get("name")
    conclusion = job.get("conclusion")
    return JobUpdate(
        github_id=github_id,
        status=raw_status,
        repository=repository,
        labels=tuple(labels),
        run_id=_int_or_none(job.get("run_id")),
        name=name[:300] if isinstance(name, str) else "",
        conclusion=conclusion if isinstance(conclusion, str) else "",
        runner_name=runner_name if isinstance(runner_name, str) else "",
        created_at=parse_github_datetime(job.get("created_at")),
        started_at=parse_github_datetime(job.get("started_at")) if started else None,
        completed_at=parse_github_datetime(job.get("completed_at")),
    )


def workflow_job_update(payload: Mapping[str, Any]) -> JobUpdate | None:
    """A `workflow_job` delivery as a `JobUpdate`, or None for an action we do not act on.

    The action decides the status when it names one; otherwise `workflow_job.status` does
    (requested/pending count as queued). New actions GitHub adds are acknowledged and
    ignored rather than refused.
    """
    job = payload.get("workflow_job")
    if not isinstance(job, dict):
        raise BadPayload("a workflow_job delivery without a workflow_job object")
    repository = _repository_name(payload)
    if repository is None:
        raise BadPayload("repository.full_name is missing")
    action = payload.get("action")
    status = action if action in STATUS_ACTIONS else job.get("status")
    if not isinstance(status, str) or normalise_status(status) is None:
        # Validate the rest anyway, so a broken body is a 400 whatever its action.
        job_update_from_github(job, repository=repository, status="queued")
        return None
    return job_update_from_github(job, repository=repository, status=status)


def _repository_name(payload: Mapping[str, Any]) -> str | None:
    repo = payload.get("repository")
    if isinstance(repo, dict) and isinstance(repo.get("full_name"), str):
        return repo["full_name"]
    return None


def _installation_id(payload: Mapping[str, Any]) -> int | None:
    inst = payload.get("installation")
    return _int_or_none(inst.get("id")) if isinstance(inst, dict) else None


# -- crediting the delivery (HOOK-07) --------------------------------------------------------


def owning_installation(payload: Mapping[str, Any]) -> Installation | None:
    """The installation that owns the repository the delivery names (HOOK-07).

    An App delivery carries `installation.id`, the App installation itself, so that decides
    first. A repository hook's delivery has none: then the installation that lists the
    repository, then the one whose account owns it. The secret that verified the delivery
    plays no part: one secret can serve every organisation.
    """
    github_id = _installation_id(payload)
    if github_id is not None:
        found = Installation.objects.filter(github_id=github_id).first()
        if found is not None:
            return found
    repository = _repository_name(payload)
    if repository is None:
        return None
    # JSONField `contains` is not available on SQLite; installations are few, so look in Python.
    candidates = list(Installation.objects.order_by("-active", "pk"))
    wanted = repository.lower()
    for inst in candidates:
        if any(isinstance(r, str) and r.lower() == wanted for r in inst.repositories or ()):
            return inst
    owner = wanted.split("/", 1)[0]
    for inst in candidates:
        if inst.account.lower() == owner:
            return inst
    return None


def _note_webhook(installation: Installation, now: datetime) -> None:
    """POLL-03: this installation's own deliveries are arriving. Never moves backwards."""
    Installation.objects.filter(pk=installation.pk).filter(
        Q(last_webhook_at__isnull=True) | Q(last_webhook_at__lt=now)
    ).update(last_webhook_at=now)


# -- installation events (optional bookkeeping) -----------------------------------------------


def _repo_names(items: Any) -> list[str]:
    if not isinstance(items, list):
        return []
    return [
        r["full_name"] for r in items if isinstance(r, dict) and isinstance(r.get("full_name"), str)
    ]


def _installation_event(event: str, payload: Mapping[str, Any], now: datetime) -> None:
    """Keep the Installation row in step with `installation` / `installation_repositories`.

    Only additions: a new installation's row, and repositories added or removed. Deletion and
    suspension are left to the operator, who sees them in GitHub.
    """
    inst = payload.get("installation")
    github_id = _installation_id(payload)
    if github_id is None or not isinstance(inst, dict):
        return
    action = payload.get("action")
    if event == "installation" and action == "created":
        account = inst.get("account") if isinstance(inst.get("account"), dict) else {}
        login = account.get("login") if isinstance(account.get("login"), str) else ""
        if not login:
            return
        # A personal account cannot have organisation runners: its runners are per repository.
        kind = (
            Installation.Kind.ORG
            if account.get("type") == "Organization"
            else Installation.Kind.REPO
        )
        row, created = Installation.objects.get_or_create(
            github_id=github_id,
            defaults={
                "account": login[:200],
                "kind": kind,
                "repositories": _repo_names(payload.get("repositories")),
            },
        )
        if created:
            audit.record(
                actor=ACTOR,
                action="installation.created",
                target=row,
                detail={"account": login, "kind": kind},
                at=now,
            )
    elif event == "installation_repositories" and action in ("added", "removed"):
        row = Installation.objects.select_for_update().filter(github_id=github_id).first()
        if row is None:
            return
        added = _repo_names(payload.get("repositories_added"))
        removed = {r.lower() for r in _repo_names(payload.get("repositories_removed"))}
        repos = [r for r in (row.repositories or []) if str(r).lower() not in removed]
        repos += [r for r in added if r.lower() not in {str(x).lower() for x in repos}]
        if repos != row.repositories:
            Installation.objects.filter(pk=row.pk).update(repositories=repos)
            audit.record(
                actor=ACTOR,
                action="installation.repositories",
                target=row,
                detail={"added": added, "removed": sorted(removed)},
                at=now,
            )


# -- the endpoint's logic ----------------------------------------------------------------------


def ingest(
    *,
    body: bytes,
    event: str | None,
    delivery_id: str | None,
    signature: str | None,
    secrets: Sequence[str],
    now: datetime,
    max_body: int | None = None,
) -> Outcome:
    """Verify, record and apply one delivery; the answer for `POST /webhooks/github`.

    Refused deliveries (401, 400, 413) record nothing. An accepted one writes its
    WebhookDelivery row and its job update in one transaction, so a crash can never leave
    one without the other; a redelivery under the same X-GitHub-Delivery finds the row and
    changes nothing (HOOK-02).
    """
    if max_body is not None and len(body) > max_body:
        return Outcome(413, {"error": f"the delivery is larger than {max_body} bytes"})
    secrets = [s for s in secrets if s]
    if not secrets:
        return Outcome(
            401,
            {
                "error": "the GitHub webhook secret is not configured "
                "(github.webhook_secrets or ZOOMIES_GITHUB_WEBHOOK_SECRET); "
                "unsigned deliveries are never accepted"
            },
        )
    if not signature_matches(body, signature, secrets):
        what = "missing" if not signature else "not valid for any configured secret"
        return Outcome(401, {"error": f"X-Hub-Signature-256 is {what}"})
    if not event:
        return Outcome(400, {"error": "X-GitHub-Event is missing"})
    if not delivery_id:
        return Outcome(400, {"error": "X-GitHub-Delivery is missing"})
    if len(delivery_id) > 100:
        return Outcome(400, {"error": "X-GitHub-Delivery is longer than 100 characters"})
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return Outcome(400, {"error": "the body is not JSON"})
    if not isinstance(payload, dict):
        return Outcome(400, {"error": "the body is not a JSON object"})
    try:
        update = workflow_job_update(payload) if event == "workflow_job" else None
    except BadPayload as exc:
        return Outcome(400, {"error": str(exc)})

    action = payload.get("action") if isinstance(payload.get("action"), str) else ""
    repository = _repository_name(payload) or ""
    with transaction.atomic():
        try:
            with transaction.atomic():
                delivery = WebhookDelivery.objects.create(
                    delivery_id=delivery_id,
                    event=event[:64],
                    action=action[:64],
                    repository=repository[:200],
                    received_at=now,
                )
        except IntegrityError:
            log.info("webhook %s (%s): a redelivery; nothing to do", delivery_id, event)
            return Outcome(200, {"duplicate": True, "delivery": delivery_id})
        if event in ("installation", "installation_repositories"):
            _installation_event(event, payload, now)
        # Credited after an installation event, so a new installation's first delivery counts.
        installation = owning_installation(payload)
        if installation is not None:
            WebhookDelivery.objects.filter(pk=delivery.pk).update(installation=installation)
            _note_webhook(installation, now)
        if update is not None:
            apply_job_update(
                update, installation=installation, now=now, source="webhook", actor=ACTOR
            )
        # HOOK-04: the reconcile pass runs elsewhere, woken once these rows are visible.
        transaction.on_commit(_wake)
    return Outcome(200, {"ok": True, "delivery": delivery_id, "event": event})


def _wake() -> None:
    from runners.wake import wake_reconcile

    wake_reconcile()
