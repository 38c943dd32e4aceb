"""Claim codes: a machine someone else provisioned joins with no long-lived secret (ESC-01..09).

A scale-up event may carry a single-use claim code, the host name the new machine must join
under, when the code expires, and the controller URL to dial. The machine's agent sends the
code in its join request instead of a join token; the controller checks it, spends it and
mints the host's agent credential there and then (ESC-03, ESC-05).

The code is never stored. It is derived from the event id with the controller's signing key
(Django's SECRET_KEY, kept in the data directory), so every try of the attempt can render the
same body without the code sitting in a row; the database keeps only its SHA-256 (ESC-05).
The stored body holds a placeholder where the code goes, so neither the API nor the admin
can show it.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime

from django.db import IntegrityError, OperationalError, transaction
from django.utils.crypto import salted_hmac

from accounts import audit
from capacity import actions, events, metrics
from capacity.config import CapacityConfig
from capacity.models import Attempt, ClaimCode, Spawn, SpawnState
from capacity.planner import Emit
from fleet.actions import InvalidJoinToken
from zoomies_site.core import registry

log = logging.getLogger("zoomies.capacity.claims")

PLACEHOLDER = "<claim code: sent, never stored>"
_SALT = "zoomies.capacity.claim_code"
SPAWN_PREFIX = "zoomies-spawn-"


class ClaimRefused(InvalidJoinToken):
    """The code is unknown, expired, spent, or for another host name: a 401 to the agent."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def claim_code_for(event_id: str) -> str:
    """The claim code of the scale-up with this event id; 64 hex characters."""
    return salted_hmac(_SALT, event_id, algorithm="sha256").hexdigest()


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def render_body(attempt_body: str, event_id: str) -> bytes:
    """The exact bytes a try sends: the stored body with the derived code in its place."""
    placeholder = events.render({"claim_code": PLACEHOLDER})[1:-1]  # '"claim_code":"<...>"'
    if placeholder not in attempt_body.encode():
        return attempt_body.encode()
    real = events.render({"claim_code": claim_code_for(event_id)})[1:-1]
    return attempt_body.encode().replace(placeholder, real, 1)


def controller_url(config: CapacityConfig) -> str:
    """ESC-09: the destination's own controller URL, else the controller's public URL
    (server.public_url), else its listening URL (a loopback one is a configuration
    finding, config.no_public_url: no started machine can dial it)."""
    if config.controller_url:
        return config.controller_url
    public: str = registry.get("server.public_url")
    if public:
        return public.rstrip("/")
    scheme = "https" if registry.get("server.tls_cert") else "http"
    return f"{scheme}://{registry.get('server.bind')}"


class SpawnRefused(Exception):
    """A scale-up not asked for: over the provision cap, or the cap could not be checked."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


IN_FLIGHT = (SpawnState.PROVISIONING, SpawnState.ACTIVE)


def provisions_in_flight() -> int:
    """Spawns provisioning or active, in every process's records (ESC-12)."""
    return Spawn.objects.filter(state__in=IN_FLIGHT).count()


def start_claimed_scale_up(emit: Emit, *, config: CapacityConfig, now: datetime) -> Attempt:
    """The scale-up attempt, its spawn record and claim hash, in one transaction (ESC-01,
    ESC-07, ESC-08, ESC-12, ESC-13).

    The cap is counted from the spawn records every process shares, in the transaction that
    adds one: a provision that never joined counts until the backstop ends it. Over the cap,
    or when the count cannot be taken (the database is locked by another writer, or not
    answering), nothing is written and SpawnRefused says why; the next pass offers it again.
    """
    host_name = SPAWN_PREFIX + secrets.token_hex(5)
    expires = now + config.claim_ttl
    extra = {
        "claim_code": PLACEHOLDER,
        "host_name": host_name,
        "claim_expires_at": events.timestamp(expires),
        "controller_url": controller_url(config),
    }

    def spawn_and_claim(attempt: Attempt) -> None:
        in_flight = provisions_in_flight()
        if in_flight >= config.max_provisions:
            raise SpawnRefused(
                "cap",
                f"{in_flight} provisions in flight, at the cap of {config.max_provisions} "
                "(capacity_demand.max_provisions)",
            )
        spawn = Spawn.objects.create(
            host_name=host_name,
            attempt=attempt,
            pool_id=emit.reading.pool_id,
            destination_url=config.destination_url,
            state=SpawnState.PROVISIONING,
            created_at=now,
        )
        ClaimCode.objects.create(
            code_hash=code_hash(claim_code_for(attempt.event_id)),
            spawn=spawn,
            created_at=now,
            expires_at=expires,
        )
        audit.record(
            actor=actions.ACTOR,
            action="capacity.spawn",
            target=spawn,
            detail={"event_id": attempt.event_id, "host_name": host_name},
            at=now,
        )

    try:
        return actions.start_emit(
            emit,
            destination_url=config.destination_url,
            now=now,
            extra=extra,
            also=spawn_and_claim,
        )
    except SpawnRefused:
        metrics.SPAWN_REFUSALS.inc()
        raise
    except OperationalError as exc:
        # ESC-13: never read as a capacity signal; counted by why the check could not run.
        reason = "contended" if "locked" in str(exc).lower() else "unreachable"
        metrics.CAP_LOCK_FAILURES.labels(reason=reason).inc()
        raise SpawnRefused(reason, f"the provision cap could not be checked ({reason})") from exc


def redeem_claim_code(*, claim_code: str, name: str, now: datetime, actor: str = "") -> Spawn:
    """Spend a claim code for the host joining as `name`; the spawn it belongs to.

    A compare-and-set spends it, so two joins racing with one code cannot both win
    (ESC-04). Any process sharing the database can redeem it (ESC-08). A refusal is
    audited in its own transaction, then raised as ClaimRefused; the code never appears in
    the audit row or the log, only the host name does.
    """
    hashed = code_hash(claim_code) if isinstance(claim_code, str) and claim_code else ""
    actor = actor or f"agent:{name}"
    with transaction.atomic(durable=True):
        claim = ClaimCode.objects.select_related("spawn").filter(code_hash=hashed).first()
        refusal = _refusal(claim, name, now)
        if refusal is None:
            assert claim is not None  # noqa: S101  # narrows the type; the code above guarantees it
            spent = ClaimCode.objects.filter(
                pk=claim.pk, redeemed_at__isnull=True, expires_at__gt=now
            ).update(redeemed_at=now)
            if not spent:
                refusal = ("spent", "the claim code has already been redeemed")
            else:
                audit.record(
                    actor=actor,
                    action="capacity.claim.redeemed",
                    target=claim.spawn,
                    detail={"host_name": name, "event_id": claim.spawn.attempt.event_id},
                    at=now,
                )
                return claim.spawn
    reason, message = refusal
    _audit_refusal(reason, message, name=name, claim=claim, actor=actor, now=now)
    raise ClaimRefused(reason, message)


def _refusal(claim: ClaimCode | None, name: str, now: datetime) -> tuple[str, str] | None:
    if claim is None:
        return "unknown", "the claim code is unknown"
    if claim.redeemed_at is not None:
        return "spent", "the claim code has already been redeemed"
    if claim.expires_at <= now:
        return "expired", "the claim code has expired"
    if claim.spawn.host_name != name:
        return "wrong-name", f"the claim code is for another host name, not {name}"
    return None


def _audit_refusal(
    reason: str, message: str, *, name: str, claim: ClaimCode | None, actor: str, now: datetime
) -> None:
    metrics.CLAIM_REFUSALS.labels(reason=reason).inc()
    try:
        with transaction.atomic(durable=True):
            audit.record(
                actor=actor,
                action="capacity.claim.refused",
                target=claim.spawn if claim is not None else None,
                detail={"host_name": name, "reason": reason, "why": message},
                at=now,
            )
    except IntegrityError:  # an audit row must never turn a 401 into a 500
        log.exception("could not audit a refused claim for %s", name)
    log.warning("claim refused for host %s: %s", name, message)
