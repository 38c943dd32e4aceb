"""GitHub webhook ingest (spec "A job arrives" steps 1-2; HOOK-01..07).

`check` and `record` are everything `POST /webhooks/github` does, minus HTTP: verify the
signature over the raw body and parse (no database), then record the delivery and apply the
job update in one transaction, and wake the reconcile pass after the commit. `record` takes
a burst of deliveries at once (runners.webhook_writer calls it from one thread). It makes
no GitHub call and schedules nothing itself (HOOK-04): the answer goes back as soon as the
rows are written, because GitHub gives a delivery 10 s and never retries a failed one on
its own.

`job_update_from_github` turns GitHub's job object (a delivery's `workflow_job`, or an item
of the REST jobs list the poller reads) into a `JobUpdate`, so both sources feed
`runners.actions.apply_job_update` the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import Q

from runners.actions import JobUpdate, apply_job_update, normalise_status, record_new_queued_jobs
from runners.actions import installations as installation_actions
from runners.actions.jobs import JobMove, apply_job_moves_together, choose_job_moves
from runners.job_objects import (
    BadPayload,
    checked_github_id,
    checked_text,
    int_or_none,
    job_update_from_github,
    storable,
)
from runners.models import Installation, Job, WebhookDelivery
from runners.states import JobStatus
from runners.transitions import MoveLost
from runners.wake import wake_reconcile

log = logging.getLogger("zoomies.webhooks")

ACTOR = "github:webhook"
SIGNATURE_PREFIX = "sha256="
# The actions that name a job status outright. GitHub can send action "queued" with status
# "waiting" (an environment-gated job), so for these the action wins over workflow_job.status.
STATUS_ACTIONS = frozenset(
    {JobStatus.QUEUED, JobStatus.IN_PROGRESS, JobStatus.COMPLETED, JobStatus.WAITING}
)
# A burst's new queued jobs, and its known jobs' moves, are written together from this many
# on: one alone too, as a single `in_progress` or `completed` (each job's two deliveries,
# and a single job's path) takes 21 and 26 statements that way against 26 and 32 one by
# one, 4.4 and 4.7 CPU-ms against 5.1 and 6.3 (a single `queued` 20 against 21, the same
# CPU). The one-by-one path stays for everything else (_new_queued_jobs, _known_job_moves).
BULK_FROM = 1


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


def workflow_job_update(payload: Mapping[str, Any]) -> JobUpdate | None:
    """A `workflow_job` delivery as a `JobUpdate`, or None for an action we do not act on.

    The action decides the status. An action we do not know (one GitHub adds) is
    acknowledged and ignored rather than refused, and its `workflow_job.status` is not read
    in its place (issue 29 item 4: it made a job row of whatever that said).
    """
    job = payload.get("workflow_job")
    if not isinstance(job, dict):
        raise BadPayload("a workflow_job delivery without a workflow_job object")
    repository = _repository_name(payload)
    if repository is None:
        raise BadPayload("repository.full_name is missing")
    action = payload.get("action")
    status = action if action in STATUS_ACTIONS else None
    if status is None:
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
    return int_or_none(inst.get("id")) if isinstance(inst, dict) else None


def check_payload(payload: Mapping[str, Any]) -> None:
    """BadPayload for the fields of any event that no delivery from GitHub could carry.

    Checked before anything is written, so a refused delivery records nothing.
    """
    action = payload.get("action")
    if action is not None and not isinstance(action, str):
        raise BadPayload("action is not a string")
    checked_text(action, "action", 64)
    inst = payload.get("installation")
    if isinstance(inst, dict):
        checked_github_id(inst.get("id"), "installation.id")
    repository = _repository_name(payload)
    if repository is not None:
        checked_text(repository, "repository.full_name", 200)


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
        # An App delivery names its installation: one not configured here is nobody's, and
        # never the installation whose account happens to own a repository of that name
        # (issue 29 item 2: another installation's pool minted a runner for it).
        return Installation.objects.filter(github_id=github_id).first()
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
        r["full_name"]
        for r in items
        if isinstance(r, dict)
        and isinstance(r.get("full_name"), str)
        and storable(r["full_name"])
        and len(r["full_name"]) <= 200
    ]


def _installation_event(event: str, payload: Mapping[str, Any], now: datetime) -> None:
    """Keep the Installation row in step with `installation` / `installation_repositories`.

    A new installation's row, repositories added or removed, and an installation deleted or
    suspended at GitHub: kept as removed (inactive, its pools paused, no more calls for it),
    audited, and named in the problems list (issue 29 item 3).
    """
    inst = payload.get("installation")
    github_id = _installation_id(payload)
    if github_id is None or not isinstance(inst, dict):
        return
    action = payload.get("action")
    if event == "installation" and action == "created":
        account = inst.get("account") if isinstance(inst.get("account"), dict) else {}
        login = account.get("login") if isinstance(account.get("login"), str) else ""
        if not login or not storable(login):
            return
        # A personal account cannot have organisation runners: its runners are per repository.
        kind = (
            Installation.Kind.ORG
            if account.get("type") == "Organization"
            else Installation.Kind.REPO
        )
        try:
            installation_actions.add_installation(
                github_id=github_id, account=login[:200], kind=kind,
                repositories=_repo_names(payload.get("repositories")), actor=ACTOR, now=now,
                only_new=True,
            )  # fmt: skip
        except ValidationError as exc:
            log.warning("installation %s from GitHub not recorded: %s", github_id, exc)
    elif event == "installation" and action in ("deleted", "suspend"):
        row = Installation.objects.filter(github_id=github_id).first()
        if row is not None:
            why = "uninstalled at GitHub" if action == "deleted" else "suspended at GitHub"
            installation_actions.remove_installation(row, actor=ACTOR, now=now, why=why)
    elif event == "installation_repositories" and action in ("added", "removed"):
        row = Installation.objects.filter(github_id=github_id).first()
        if row is None:
            return
        added = _repo_names(payload.get("repositories_added"))
        removed = _repo_names(payload.get("repositories_removed"))
        installation_actions.change_repositories(
            row, added=added, removed=removed, actor=ACTOR, now=now
        )
        if removed:
            # Issue 29 item 3: the pools registering there are paused, the reap forgets them.
            installation_actions.repositories_removed(row, removed, actor=ACTOR, now=now)


# -- the endpoint's logic ----------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(body: bytes) -> Any:
    """The body as JSON, or BadPayload: strict JSON only (no NaN or Infinity), bounded depth.

    The decoder recurses once per nesting level, so a body nested deeper than Python's
    recursion limit raises RecursionError; no delivery of GitHub's nests more than a few
    dozen levels.
    """
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise BadPayload("the body is nested too deeply to be a GitHub delivery") from None
    except (UnicodeDecodeError, ValueError):
        raise BadPayload("the body is not JSON") from None


@dataclass(frozen=True)
class Delivery:
    """A delivery whose signature and body passed every check: what `record` writes."""

    delivery_id: str
    event: str
    payload: dict[str, Any]
    update: JobUpdate | None
    received_at: datetime


def check(
    *,
    body: bytes,
    event: str | None,
    delivery_id: str | None,
    signature: str | None,
    secrets: Sequence[str],
    now: datetime,
    max_body: int | None = None,
) -> Outcome | Delivery:
    """Verify and parse one delivery without touching the database.

    The refusal (401, 400, 413) as an Outcome, or the Delivery to record. Nothing refused
    here is ever written.
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
    if not storable(event) or not storable(delivery_id):
        return Outcome(400, {"error": "a GitHub header contains a NUL character"})
    return parse(body=body, event=event, delivery_id=delivery_id, now=now)


def parse(*, body: bytes, event: str, delivery_id: str, now: datetime) -> Outcome | Delivery:
    """The body of a delivery whose headers and signature `check` accepted: the refusal
    (400) as an Outcome, or the Delivery to record. The webhook inbox (runners.
    webhook_inbox) parses the body it kept with this, as `check` did before it was kept."""
    try:
        payload = parse_json(body)
    except BadPayload as exc:
        return Outcome(400, {"error": str(exc)})
    if not isinstance(payload, dict):
        return Outcome(400, {"error": "the body is not a JSON object"})
    try:
        check_payload(payload)
        update = workflow_job_update(payload) if event == "workflow_job" else None
    except BadPayload as exc:
        return Outcome(400, {"error": str(exc)})
    return Delivery(delivery_id, event, payload, update, now)


@dataclass
class _Burst:
    """What the deliveries of one `record` call share: installation look-ups and marks."""

    owners: dict[tuple[int | None, str | None], Installation | None] = field(default_factory=dict)
    # POLL-03's mark, once per installation a burst: the latest receipt time of its deliveries.
    seen: dict[int, tuple[Installation, datetime]] = field(default_factory=dict)

    def owner(self, payload: Mapping[str, Any]) -> Installation | None:
        key = (_installation_id(payload), _repository_name(payload))
        if key not in self.owners:
            self.owners[key] = owning_installation(payload)
        return self.owners[key]

    def saw(self, installation: Installation, at: datetime) -> None:
        known = self.seen.get(installation.pk)
        if known is None or known[1] < at:
            self.seen[installation.pk] = (installation, at)


class _Duplicate(Exception):
    """A redelivery: its savepoint is rolled back and it is answered as a duplicate."""


def _record_one(delivery: Delivery, burst: _Burst) -> Outcome:
    """Write one delivery and its job update (HOOK-02) in the caller's savepoint.

    Raises _Duplicate for a delivery id already recorded: the caller's savepoint undoes the
    failed insert (one savepoint a delivery, not one more for the insert alone).
    """
    payload, event, now = delivery.payload, delivery.event, delivery.received_at
    installation_event = event in ("installation", "installation_repositories")
    # An installation event may create the installation it is credited to, so it is looked
    # up after that event's own write; any other delivery's row is written with it at once.
    installation = None if installation_event else burst.owner(payload)
    try:
        row = WebhookDelivery.objects.create(**_delivery_fields(delivery, installation))
    except IntegrityError:
        raise _Duplicate from None
    if installation_event:
        _installation_event(event, payload, now)
        burst.owners.clear()  # the installations may have changed
        installation = burst.owner(payload)
        if installation is not None:
            WebhookDelivery.objects.filter(pk=row.pk).update(installation=installation)
    if installation is not None:
        burst.saw(installation, now)
    unknown = _installation_id(payload) if installation is None else None
    if delivery.update is not None and unknown is not None:
        log.info("webhook %s: installation %s is not configured here; the job is not ours",
                 delivery.delivery_id, unknown)  # fmt: skip
        return Outcome(
            200,
            {"ok": True, "delivery": delivery.delivery_id, "event": event,
             "ignored": f"installation {unknown} is not configured here"},
        )  # fmt: skip
    if delivery.update is not None:
        apply_job_update(
            delivery.update, installation=installation, now=now, source="webhook", actor=ACTOR
        )
    return Outcome(200, {"ok": True, "delivery": delivery.delivery_id, "event": event})


def _delivery_fields(delivery: Delivery, installation: Installation | None) -> dict[str, Any]:
    payload = delivery.payload
    action = payload.get("action") if isinstance(payload.get("action"), str) else ""
    return {
        "delivery_id": delivery.delivery_id,
        "event": delivery.event[:64],
        "action": action[:64],
        "repository": (_repository_name(payload) or "")[:200],
        "received_at": delivery.received_at,
        "installation": installation,
    }


def _recorded_ids(deliveries: Sequence[Delivery], indexes: list[int]) -> set[str]:
    """Which of these deliveries' ids are recorded already (a redelivery goes one by one)."""
    return set(
        WebhookDelivery.objects.filter(
            delivery_id__in=[deliveries[i].delivery_id for i in indexes]
        ).values_list("delivery_id", flat=True)
    )


def _new_queued_jobs(deliveries: Sequence[Delivery], burst: _Burst) -> list[int]:
    """The deliveries of a burst (their indexes) that only announce, as queued, a job never
    seen before, through an installation configured here: a busy installation's common case,
    which `_record_new_queued` writes in a handful of statements for all of them instead of
    about ten each. Anything else (a redelivery, two deliveries for one job in the burst, a
    job already known, another event, an installation not configured here) goes one by one."""
    ids = Counter(d.delivery_id for d in deliveries)
    jobs = Counter(d.update.github_id for d in deliveries if d.update is not None)
    candidates = [
        i
        for i, d in enumerate(deliveries)
        if d.event == "workflow_job"
        and d.update is not None
        and ids[d.delivery_id] == 1
        and jobs[d.update.github_id] == 1
        and normalise_status(d.update.status) == JobStatus.QUEUED
        and burst.owner(d.payload) is not None
    ]
    if len(candidates) < BULK_FROM:
        return []
    known_ids = _recorded_ids(deliveries, candidates)
    known_jobs = set(
        Job.objects.filter(
            github_id__in=[deliveries[i].update.github_id for i in candidates]  # type: ignore[union-attr]
        ).values_list("github_id", flat=True)
    )
    return [
        i
        for i in candidates
        if deliveries[i].delivery_id not in known_ids
        and deliveries[i].update.github_id not in known_jobs  # type: ignore[union-attr]
    ]


def _record_new_queued(deliveries: list[Delivery], burst: _Burst) -> None:
    """The delivery rows and their new jobs, one INSERT each (HOOK-02 as one by one: a
    delivery is recorded with its job or not at all, since the caller's savepoint holds
    both)."""
    owners = [burst.owner(d.payload) for d in deliveries]
    WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(**_delivery_fields(d, owner))
            for d, owner in zip(deliveries, owners, strict=True)
        ]
    )
    record_new_queued_jobs(
        [(d.update, owner, d.received_at) for d, owner in zip(deliveries, owners, strict=True)],  # type: ignore[misc]
        source="webhook",
        actor=ACTOR,
    )
    for delivery, owner in zip(deliveries, owners, strict=True):
        burst.saw(owner, delivery.received_at)  # type: ignore[arg-type]


def _known_job_moves(
    deliveries: Sequence[Delivery], burst: _Burst, taken: set[int]
) -> dict[int, JobMove]:
    """The deliveries of a burst (by index) that move a known job forward to in_progress or
    completed in the common way `choose_job_moves` describes: a busy fleet's other two
    deliveries a job, written together by `_record_known_moves` in about two statements
    each instead of twenty. Each job, delivery id and runner name must be the burst's only
    one (the group is written before the deliveries that go one by one, so nothing it
    touches may be touched by them, nor a runner their jobs name), and a burst that changes
    installations goes one by one whole (an installation event may change who owns the
    deliveries after it)."""
    if any(d.event in ("installation", "installation_repositories") for d in deliveries):
        return {}
    ids = Counter(d.delivery_id for d in deliveries)
    jobs = Counter(d.update.github_id for d in deliveries if d.update is not None)
    names = Counter(d.update.runner_name for d in deliveries if d.update is not None)
    candidates = [
        i
        for i, d in enumerate(deliveries)
        if i not in taken
        and d.event == "workflow_job"
        and d.update is not None
        and d.update.runner_name
        and ids[d.delivery_id] == 1
        and jobs[d.update.github_id] == 1
        and names[d.update.runner_name] == 1
        and normalise_status(d.update.status) in (JobStatus.IN_PROGRESS, JobStatus.COMPLETED)
        and burst.owner(d.payload) is not None
    ]
    if len(candidates) < BULK_FROM:
        return {}
    known_ids = _recorded_ids(deliveries, candidates)
    # A delivery going one by one moves the runner its job names in the row when its own
    # update names none (a job cancelled while running): that runner is not the group's.
    grouped = set(candidates)
    others = [d.update.github_id for i, d in enumerate(deliveries)
              if d.update is not None and i not in grouped]  # fmt: skip
    theirs = set(
        Job.objects.filter(github_id__in=others).exclude(runner_name="").values_list(
            "runner_name", flat=True)
    ) if others else set()  # fmt: skip
    candidates = [
        i
        for i in candidates
        if deliveries[i].delivery_id not in known_ids
        and deliveries[i].update.runner_name not in theirs  # type: ignore[union-attr]
    ]
    if len(candidates) < BULK_FROM:
        return {}
    chosen = choose_job_moves(
        [(deliveries[i].update, burst.owner(deliveries[i].payload), deliveries[i].received_at)
         for i in candidates]  # type: ignore[misc]
    )  # fmt: skip
    moves = {i: move for i, move in zip(candidates, chosen, strict=True) if move is not None}
    return moves if len(moves) >= BULK_FROM else {}


def _record_known_moves(deliveries: Sequence[Delivery], moves: dict[int, JobMove]) -> None:
    """The delivery rows and their jobs' moves (HOOK-02 as one by one: the caller's
    savepoint holds both)."""
    WebhookDelivery.objects.bulk_create(
        [WebhookDelivery(**_delivery_fields(deliveries[i], moves[i].installation))
         for i in sorted(moves)]
    )  # fmt: skip
    apply_job_moves_together([moves[i] for i in sorted(moves)], source="webhook", actor=ACTOR)


def _written_together(write: Callable[[], None], what: str) -> bool:
    """Run a group's write in a savepoint; False when it did not hold and each of the group
    must go one by one instead."""
    try:
        with transaction.atomic():
            write()
    except (OperationalError, InterfaceError):
        raise  # the database itself (locked, gone): the writer's to answer, as before
    except Exception as exc:
        if transaction.get_rollback():
            raise
        # Another process wrote one of them meanwhile, or a row broke (or, a bug, the group
        # held one it should not): each goes one by one, where a duplicate or a failure
        # takes no other with it.
        expected = isinstance(exc, (DatabaseError, MoveLost))
        log.log(logging.INFO if expected else logging.WARNING,
                "a burst's %s were not written together (%s): one by one", what, exc,
                exc_info=not expected)  # fmt: skip
        return False
    return True


def record(deliveries: Sequence[Delivery]) -> list[Outcome | Exception]:
    """Record a burst of checked deliveries in ONE transaction; an answer for each, in order.

    Each delivery writes its WebhookDelivery row and its job update inside a savepoint of
    its own, so a crash never leaves one without the other, a redelivery under the same
    X-GitHub-Delivery finds the row and changes nothing (HOOK-02), and a delivery that
    fails (its exception is its answer) takes no other delivery of the burst with it. What
    the burst shares is done once: the installations it names are looked up once and marked
    once (POLL-03), and the reconcile pass is woken once, with the commit (HOOK-04). A
    database error that leaves the transaction unusable raises: nothing was recorded.
    """
    burst = _Burst()
    answers: list[Outcome | Exception] = []
    with transaction.atomic():
        together = set(_new_queued_jobs(deliveries, burst))
        if together and not _written_together(
            lambda: _record_new_queued([deliveries[i] for i in sorted(together)], burst),
            "new jobs",
        ):
            together = set()
        moves = _known_job_moves(deliveries, burst, together)
        if moves and _written_together(lambda: _record_known_moves(deliveries, moves), "moves"):
            for i in moves:
                burst.saw(moves[i].installation, deliveries[i].received_at)  # type: ignore[arg-type]
            together |= set(moves)
        for index, delivery in enumerate(deliveries):
            if index in together:
                answers.append(
                    Outcome(200, {"ok": True, "delivery": delivery.delivery_id,
                                  "event": delivery.event})
                )  # fmt: skip
                continue
            try:
                with transaction.atomic():
                    answers.append(_record_one(delivery, burst))
            except _Duplicate:
                log.info(
                    "webhook %s (%s): a redelivery; nothing to do",
                    delivery.delivery_id,
                    delivery.event,
                )
                answers.append(Outcome(200, {"duplicate": True, "delivery": delivery.delivery_id}))
            except Exception as exc:
                if transaction.get_rollback():
                    raise  # the savepoint could not be rolled back: the burst is lost whole
                log.exception("webhook %s could not be recorded", delivery.delivery_id)
                answers.append(exc)
        for installation, at in burst.seen.values():
            _note_webhook(installation, at)
        if any(isinstance(a, Outcome) and a.body.get("ok") for a in answers):
            # HOOK-04: the reconcile pass runs elsewhere. Its wake (a flag and, with the ORM
            # broker, the task's row) commits with these rows, so the pass sees them; in a
            # transaction of its own it waited for the write lock a second time per burst
            # (about 6% of the writer's time under load, docs/performance.md).
            wake_reconcile()
    return answers
