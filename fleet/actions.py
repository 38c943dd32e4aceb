"""Host, join-token and agent-protocol actions: every fleet state change goes through here,
but an agent's answers to its tasks (fleet.task_results).

Each action is one transaction that changes its rows and writes its audit row. The agent
protocol views (fleet.api), the admin and the management commands call them; so do the
tests, with a chosen `now`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from accounts import audit
from fleet import protocol
from fleet.errors import (
    FleetError,
    InvalidAgentToken,
    InvalidJoinToken,
    InvalidRequest,
    TaskNotFound,
    TaskNotInFlight,
    TokenNotRenewable,
)
from fleet.host_checks import HOST_CHECK_COOLDOWN, HostCheckRefused, note_host_check
from fleet.memory import memory_plan_for
from fleet.models import AgentTask, Host, JoinToken
from fleet.protocol import MemoryRules
from fleet.runner_side import runner_side
from fleet.selectors import AGENT_TOKEN_PREFIX, JOIN_TOKEN_PREFIX, hash_secret
from fleet.states import OPEN_TASK_STATES, HostHealth, TaskKind, TaskState
from fleet.taskqueue import cancel_tasks, enqueue_task, settle_in_flight
from fleet.throttle import cpu_factor
from fleet.transitions import transition_host_health
from zoomies_site.core import registry
from zoomies_site.core.events import emit

log = logging.getLogger("zoomies.fleet")

REJOIN_MESSAGE = "the host joined again; its runners were dropped"
REJOIN_JOB_FAILURE = "its runner's host joined again"

# HOST-09: free space is rewritten only when it moved by more than the larger of these.
DISK_FREE_TOLERANCE_FRACTION = 0.05
DISK_FREE_TOLERANCE_FLOOR_MB = 256


__all__ = [
    "FleetError",
    "InvalidAgentToken",
    "InvalidJoinToken",
    "InvalidRequest",
    "TaskNotFound",
    "TaskNotInFlight",
    "TokenNotRenewable",
]


def agent_actor(host: Host | str) -> str:
    return host.actor if isinstance(host, Host) else f"agent:{host}"


# -- join tokens --------------------------------------------------------------------------


def create_join_token(
    *, now: datetime, actor: str, ttl: timedelta = timedelta(hours=1)
) -> tuple[JoinToken, str]:
    """Mint a single-use join token (AUTH-08); the secret is returned once, stored as sha256."""
    if ttl <= timedelta(0):
        raise InvalidRequest("a join token's lifetime must be positive")
    secret = JOIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic(durable=True):
        token = JoinToken.objects.create(
            token_hash=hash_secret(secret),
            prefix=secret[:12],
            created_at=now,
            expires_at=now + ttl,
            created_by=actor,
        )
        audit.record(
            actor=actor,
            action="join_token.create",
            target=token,
            detail={"prefix": token.prefix, "expires_at": token.expires_at.isoformat()},
            at=now,
        )
    return token, secret


# -- facts --------------------------------------------------------------------------------


def read_facts(
    body: protocol.JoinRequest | protocol.HeartbeatRequest | Mapping[str, Any],
) -> tuple[dict, dict | None, str | None]:
    """A join or heartbeat body as the protocol reads it: (the facts present, the usage
    sample or None, why a usage sample was dropped). A body given as a plain mapping is
    read here; a bad one is InvalidRequest naming the field.

    Usage is apart: a bad measurement is dropped on its own (HOST-11), it does not make the
    heartbeat fail.
    """
    if isinstance(body, Mapping):
        try:
            body = protocol.HeartbeatRequest.from_json(body)
        except protocol.ProtocolError as exc:
            raise InvalidRequest(str(exc)) from None
    usage = None if body.usage is None else dict(body.usage)
    return body.facts.to_json(), usage, body.usage_problem


def disk_free_moved(old: int | None, new: int) -> bool:
    """HOST-09: True when free space moved by more than max(5 % of the stored figure, 256 MB)."""
    if old is None:
        return True
    tolerance = max(old * DISK_FREE_TOLERANCE_FRACTION, DISK_FREE_TOLERANCE_FLOOR_MB)
    return abs(new - old) > tolerance


def _disk_fields(current: Host | None, facts: dict) -> dict:
    """HOST-10: the size says a measurement happened; without one the disk figures stay."""
    total = facts.get("disk_total_mb")
    if total is None:
        return {}
    fields: dict = {}
    resized = current is None or current.disk_total_mb != total
    if resized:
        fields["disk_total_mb"] = total
    free = facts.get("disk_free_mb")
    if free is not None and (
        resized or disk_free_moved(current.disk_free_mb if current else None, free)
    ):
        fields["disk_free_mb"] = free
    return fields


PLAIN_FACTS = (
    "capacity", "backends", "platform", "cpus", "memory_mb", "labels", "version", "backend_limits",
)  # fmt: skip


# -- join ---------------------------------------------------------------------------------


# A claim code is redeemed by the capacity layer, which sits above fleet (it reads hosts and
# writes spawn records that point at them): it registers its redeemer here at startup rather
# than fleet importing upward. The redeemer raises InvalidJoinToken (or a subclass) to refuse.
_claim_redeemer: Callable[..., object] | None = None


def set_claim_redeemer(redeemer: Callable[..., object] | None) -> None:
    global _claim_redeemer
    _claim_redeemer = redeemer


def claimed_token_ttl() -> timedelta:
    """ESC-06: how long a credential minted from a claim code, or renewed, stays valid (the
    peer's agentTokenTtlSeconds), read live."""
    ttl: timedelta = registry.get("capacity_demand.agent_token_ttl")
    return ttl


def join_host(
    *,
    join_token: str | None,
    name: str,
    facts: protocol.JoinRequest | Mapping[str, Any],
    now: datetime,
    claim_code: str | None = None,
) -> tuple[Host, str]:
    """Exchange a join token for the host's own agent token (AUTH-08, HOST-06).

    The token is spent by a compare-and-set, so two joins racing with one token cannot both
    succeed. A host joining again under its name keeps its id and gets a new agent token (the
    old one stops working); every live runner recorded against it is failed.

    With a claim code instead, the token minted expires after `claimed_token_ttl()` unless
    the agent renews it (ESC-06, `renew_agent_token`); `host.agent_token_expires_at` says when.
    """
    by_claim = bool(claim_code) and not join_token
    if not by_claim and (not isinstance(join_token, str) or not join_token):
        raise InvalidJoinToken("a join token is required")
    if not isinstance(name, str) or not protocol.HOST_NAME.match(name):
        raise InvalidRequest(
            "name must be 1-64 letters, digits, dots, dashes or underscores, "
            "starting with a letter or digit"
        )
    cleaned, usage, _dropped = read_facts(facts)
    secret = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    actor = agent_actor(name)
    if by_claim:
        if _claim_redeemer is None:
            raise InvalidJoinToken("this controller accepts no claim codes")
        _claim_redeemer(claim_code=claim_code, name=name, now=now)  # spends it, or refuses
    token_hash = hash_secret(join_token) if join_token else ""
    with transaction.atomic(durable=True):
        spent = by_claim or JoinToken.objects.filter(
            token_hash=token_hash, used_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
        if not spent:
            raise InvalidJoinToken("the join token is unknown, expired or already used")
        host = Host.objects.select_for_update().filter(name=name).first()
        fields: dict = {
            **{k: cleaned[k] for k in PLAIN_FACTS if k in cleaned},
            **_disk_fields(host, cleaned),
            "agent_token_hash": hash_secret(secret),
            "agent_token_prefix": secret[:12],
            "agent_token_expires_at": now + claimed_token_ttl() if by_claim else None,
            # A join replaces every credential the host had, a renewed-away one included.
            "previous_agent_token_hash": "",
            "previous_agent_token_expires_at": None,
            "joined_at": now,
        }
        if usage is not None:
            fields.update(usage=usage, usage_at=now)
        rejoined = host is not None
        if host is None:
            try:
                with transaction.atomic():
                    # A new host starts healthy (the field's default).
                    host = Host.objects.create(name=name, health_changed_at=now, **fields)
            except IntegrityError:
                # Another join created this name a moment ago: this one is a rejoin.
                host = Host.objects.select_for_update().get(name=name)
                rejoined = True
        if rejoined:
            Host.objects.filter(pk=host.pk).update(**fields)
            transition_host_health(
                host.pk, HostHealth.HEALTHY, now=now, actor=actor, reason="the host joined again"
            )
            host.refresh_from_db()
        JoinToken.objects.filter(token_hash=token_hash).update(host=host)
        audit.record(
            actor=actor,
            action="host.rejoin" if rejoined else "host.join",
            target=host,
            detail={"token_prefix": host.agent_token_prefix, "facts": cleaned},
            at=now,
        )
        emit("host.rejoined" if rejoined else "host.joined", host, at=now)
        if rejoined:
            _drop_runners(host, now=now, actor=actor)
    runner_side().host_joined(host, now=now)
    return host, secret


def renew_agent_token(*, host: Host, presented: str, now: datetime) -> tuple[str, datetime]:
    """ESC-06: a short-lived agent token (one minted from a claim code) for the next one;
    the new secret (returned once, stored as sha256) and when it expires.

    The agent asks over its own authenticated request, with a token still valid: one that
    has expired cannot be renewed, and the machine needs a new claim. The token presented
    stays valid until its own expiry, never longer, and any other one the host held is
    dropped: a request already sent with the old token is not refused, and a renewal whose
    answer was lost can be asked again with it. Audited, naming the prefixes only.
    """
    presented_hash = hash_secret(presented)
    secret = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic(durable=True):
        current = Host.objects.select_for_update().get(pk=host.pk)
        if current.agent_token_expires_at is None:
            raise TokenNotRenewable("this host's agent token does not expire; nothing to renew")
        if presented_hash == current.agent_token_hash:
            kept_until = current.agent_token_expires_at
        elif presented_hash == current.previous_agent_token_hash:
            kept_until = current.previous_agent_token_expires_at
        else:  # the host joined again since the request was authenticated
            raise InvalidAgentToken("the agent token is no longer this host's")
        if kept_until is None or kept_until <= now:
            raise InvalidAgentToken("the agent token has expired; the machine needs a new claim")
        expires = now + claimed_token_ttl()
        Host.objects.filter(pk=current.pk).update(
            agent_token_hash=hash_secret(secret),
            agent_token_prefix=secret[:12],
            agent_token_expires_at=expires,
            previous_agent_token_hash=presented_hash,
            previous_agent_token_expires_at=kept_until,
        )
        audit.record(
            actor=current.actor,
            action="host.token.renew",
            target=current,
            detail={
                "token_prefix": secret[:12],
                "renewed_prefix": presented[:12],
                "expires_at": expires.isoformat(),
                "renewed_expires_at": kept_until.isoformat(),
            },
            at=now,
        )
    return secret, expires


def _drop_runners(host: Host, *, now: datetime, actor: str) -> list[str]:
    """HOST-06: the old registration's runners and the creates and stops queued for them go."""
    # Removes stay queued: a workload the old registration left behind should still go.
    cancel_tasks(
        AgentTask.objects.filter(
            host=host, kind__in=[TaskKind.CREATE_RUNNER, TaskKind.STOP_RUNNER]
        ),
        now=now,
        actor=actor,
        reason="the host joined again",
    )
    return runner_side().fail_live_runners(
        host, now=now, actor=actor, message=REJOIN_MESSAGE, job_failure=REJOIN_JOB_FAILURE
    )


# -- heartbeat ----------------------------------------------------------------------------


def agent_tunables() -> protocol.AgentTunables:
    """The agent's timings from the settings: every join and heartbeat answer carries them,
    so an agent never needs a copy of the controller's configuration."""

    def seconds(key: str) -> float:
        return registry.get(key).total_seconds()

    return protocol.AgentTunables(
        heartbeat_interval=seconds("agent.heartbeat_interval"),
        long_poll_wait=seconds("agent.long_poll_wait"),
        orphan_grace=seconds("agent.orphan_grace"),
        missing_grace=seconds("agent.missing_grace"),
        shutdown_grace=seconds("agent.shutdown_grace"),
        finished_retention=seconds("agent.finished_retention"),
        bootstrap_cpu_grace=seconds("agent.bootstrap_cpu_grace"),
    )


def heartbeat_answer(host: Host) -> dict:
    return heartbeat_answer_for(host, (host.cordoned, host.throttle_level))


def heartbeat_answer_for(host: Host, standing: tuple[bool, int]) -> dict:
    """The answer for a host's (cordoned, throttle level): HOST-20, the CPU factor its
    agent applies to every runner, and HOST-24, the memory valve's rules, ride on each."""
    cordoned, level = standing
    return protocol.HeartbeatAnswer(
        cordoned=cordoned,
        tunables=agent_tunables(),
        cpu_factor=cpu_factor(level),
        memory=memory_rules_for(host),
    ).to_json()


def memory_rules_for(host: Host) -> MemoryRules | None:
    """None with agent.memory_valve off, or for a host with no runner a limit binds."""
    mode = registry.get("agent.memory_valve")
    if mode == "off":
        return None
    plan = memory_plan_for(host, only_if_lending=True)
    if plan is None or not plan.rules.runners:
        return None
    return replace(plan.rules, observe=mode == "observe")


# A heartbeat that reports nothing new this soon after the recorded one writes nothing (not
# even its usage sample). The window is this fraction of the interval, or of the slack
# between the interval and agent.heartbeat_timeout if that is smaller (validation only warns
# about an interval above half the timeout, HOST-02): a host heartbeating on time then never
# looks silent for longer than interval + window, short of the timeout (fleet/health.py).
HEARTBEAT_COALESCE_FRACTION = 1 / 3


def heartbeat_coalesce_window() -> timedelta:
    interval: timedelta = registry.get("agent.heartbeat_interval")
    slack = registry.get("agent.heartbeat_timeout") - interval
    return max(min(interval, slack), timedelta(0)) * HEARTBEAT_COALESCE_FRACTION


def _coalesced_cordon(host: Host, now: datetime) -> tuple[bool, int] | None:
    """If a heartbeat at `now` from this host need not be written (it is healthy and its
    recorded mark is fresh), whether it is cordoned and its throttle level; else None.
    Confirmed by a read (no write lock), as `host` may be stale."""
    last = host.last_heartbeat_at
    if last is None or last > now:
        return None
    window = heartbeat_coalesce_window()
    if now - last >= window:
        return None
    return (
        Host.objects.filter(
            pk=host.pk,
            health=HostHealth.HEALTHY,
            last_heartbeat_at__gt=now - window,
            last_heartbeat_at__lte=now,
        )
        .values_list("cordoned", "throttle_level")
        .first()
    )


def _fact_changes(current: Host, facts: dict) -> dict:
    """The reported facts that differ from the row's (disk figures within their tolerance)."""
    fields = {k: facts[k] for k in PLAIN_FACTS if k in facts and getattr(current, k) != facts[k]}
    fields.update(_disk_fields(current, facts))
    return fields


MEMORY_REPORT_KEYS = {"memory_loans", "memory_blocked", "memory_would_lend"}


def record_heartbeat(
    *, host: Host, facts: protocol.HeartbeatRequest | Mapping[str, Any], now: datetime
) -> dict:
    """Record a heartbeat and what it reports; answer the interval to sleep (HOST-01).

    The memory valve's record (HOST-29, HOST-32) goes first, so the rules in this answer
    already count the loans it reports: the agent lends anew from them.
    """
    if isinstance(facts, Mapping) and MEMORY_REPORT_KEYS & set(facts):
        try:
            facts = protocol.HeartbeatRequest.from_json(facts)
        except protocol.ProtocolError as exc:
            raise InvalidRequest(str(exc)) from None
    if isinstance(facts, protocol.HeartbeatRequest) and (
        facts.memory_loans or facts.memory_blocked or facts.memory_would_lend
    ):
        side = runner_side()
        side.record_memory_loans(host, facts.memory_loans or {})
        side.record_memory_loans(host, facts.memory_would_lend or {}, observed=True)
        side.record_memory_blocked(host, facts.memory_blocked or {}, now=now)
    return _record_heartbeat(host=host, facts=facts, now=now)


def _record_heartbeat(
    *, host: Host, facts: protocol.HeartbeatRequest | Mapping[str, Any], now: datetime
) -> dict:
    """The heartbeat itself, as record_heartbeat says.

    A host that was unhealthy or lost is healthy again. Only what changed is written, and a
    heartbeat that changes nothing soon after the last one writes nothing (see
    HEARTBEAT_COALESCE_FRACTION). Free disk is rewritten only when it
    moved enough (HOST-09); without a disk size the disk figures stay (HOST-10). A usage
    sample that is not an object of non-negative numbers is dropped, not the heartbeat
    (HOST-11): a bad measurement must not make a host look dead.
    """
    cleaned, usage, dropped = read_facts(facts)
    if dropped is not None:
        log.warning("host %s: dropped an invalid usage sample: %s", host.name, dropped)
    # The cheap path, from the row as the agent's token was checked against (fleet.api reads
    # it for every request): a healthy host reporting no new fact needs one UPDATE, or none.
    if host.health == HostHealth.HEALTHY and not _fact_changes(host, cleaned):
        cordoned = _coalesced_cordon(host, now)
        if cordoned is None:
            fields: dict = {"last_heartbeat_at": now}
            if usage is not None:
                fields.update(usage=usage, usage_at=now)
            # Guarded on the health: if housekeeping judged the host since the read, the
            # full path below makes it healthy again with its transition row.
            if Host.objects.filter(pk=host.pk, health=HostHealth.HEALTHY).update(**fields):
                cordoned = Host.objects.values_list("cordoned", "throttle_level").get(pk=host.pk)
        if cordoned is not None:
            return heartbeat_answer_for(host, cordoned)
    with transaction.atomic(durable=True):
        current = Host.objects.select_for_update().get(pk=host.pk)
        fields = {"last_heartbeat_at": now, **_fact_changes(current, cleaned)}
        if usage is not None:
            fields.update(usage=usage, usage_at=now)
        # The heartbeat mark first: a silence judgement guarded on the old mark now fails.
        Host.objects.filter(pk=current.pk).update(**fields)
        if current.health != HostHealth.HEALTHY:
            transition_host_health(
                current.pk,
                HostHealth.HEALTHY,
                now=now,
                actor=current.actor,
                reason="heartbeat received",
            )
            if current.health == HostHealth.LOST:
                # Issue 11 item 4: back from lost, its busy workloads are not killed.
                runner_side().host_back_from_lost(current, now=now, actor=current.actor)
        current.refresh_from_db()
    return heartbeat_answer(current)


def set_host_cordon(*, host: Host, cordoned: bool, now: datetime, actor: str) -> bool:
    """Cordon or uncordon a host: a cordoned host gets no new runners. True if it changed."""
    with transaction.atomic(durable=True):
        moved = Host.objects.filter(pk=host.pk, cordoned=not cordoned).update(cordoned=cordoned)
        if moved:
            audit.record(
                actor=actor,
                action="host.cordon" if cordoned else "host.uncordon",
                target=host,
                at=now,
            )
            emit("host.cordoned" if cordoned else "host.uncordoned", host, at=now)
    return bool(moved)


def drain_host(*, host: Host, now: datetime, actor: str) -> list[str]:
    """Cordon a host and drain every live runner on it (a busy one keeps the drain grace).

    Returns the names of the runners this call moved to draining.
    """
    with transaction.atomic(durable=True):
        if Host.objects.filter(pk=host.pk, cordoned=False).update(cordoned=True):
            emit("host.cordoned", host, at=now)
        audit.record(actor=actor, action="host.drain", target=host, at=now)
        return runner_side().drain_host_runners(
            host, now=now, actor=actor, reason="its host is drained"
        )


# -- task results -------------------------------------------------------------------------


# -- host checks (TASK-09..11) ---------------------------------------------------------------


def request_host_check(host: Host, *, now: datetime, actor: str) -> AgentTask:
    """Queue a check of `host` for its agent (TASK-09); HostCheckRefused while one is under
    way or within the cooldown after the last one ended (TASK-11)."""
    with transaction.atomic(durable=True):
        Host.objects.select_for_update().filter(pk=host.pk).first()
        last = AgentTask.objects.filter(host=host, kind=TaskKind.CHECK_HOST).order_by("-pk").first()
        if last is not None and last.state in OPEN_TASK_STATES:
            raise HostCheckRefused(f"a check of {host.name} is already under way")
        if last is not None and last.finished_at and now - last.finished_at < HOST_CHECK_COOLDOWN:
            wait = HOST_CHECK_COOLDOWN - (now - last.finished_at)
            raise HostCheckRefused(
                f"{host.name} was checked moments ago: ask again in {wait.total_seconds():.0f} s"
            )
        task = enqueue_task(
            host_id=host.pk, runner_id=None, kind=TaskKind.CHECK_HOST, payload={}, now=now
        )
        note_host_check(host.pk, task, state="pending", now=now)
        audit.record(actor=actor, action="host.check", target=host, at=now)
    return task


# -- a restarted agent's inventory (issue 11 items 3 and 5) -------------------------------


def record_inventory(
    *, host: Host, inventory: protocol.InventoryRequest, now: datetime
) -> protocol.InventoryAnswer:
    """Settle what the host had in flight from its restarted agent's inventory, and answer
    the runners the host should hold.

    The agent sends it before its first task poll, so every task in flight to the host was
    taken by its dead predecessor: each is settled now (`taskqueue.settle_in_flight`), not
    when its lease ends, 20 minutes on for a create. A create whose runner ended meanwhile is
    cancelled. The answer (the runner side's `expected_runners`) lets the agent report what is
    missing: a runner whose workload is not on the host is failed by the agent's own missing
    report (RUN-15, AGENT-17) as soon as the workload is a minute old, so a provisioning
    runner whose create was answered but never came up does not wait out the provision
    timeout.
    """
    actor = agent_actor(host)
    if Host.objects.filter(pk=host.pk).exclude(health=HostHealth.HEALTHY).exists():
        # The inventory comes before the agent's first heartbeat, and it is as good a sign
        # of life: a host judged lost is back before its adopted runners are looked at, or
        # the next health tick would fail again the runners revived below (issue 21 item 20).
        record_heartbeat(host=host, facts={}, now=now)
    with transaction.atomic(durable=True):
        # Polls this host's dead agent left open may still be waiting in a web process: from
        # now they take nothing (`taskqueue.take_tasks`), or a task settled here would go to
        # a closed connection and wait out its lease after all.
        Host.objects.filter(pk=host.pk).update(agent_started_at=now)
        ended = AgentTask.objects.filter(
            host=host, kind=TaskKind.CREATE_RUNNER, state=TaskState.IN_FLIGHT, taken_at__lt=now
        ).exclude(runner__state__in=list(runner_side().LIVE_STATES))
        cancelled = cancel_tasks(
            ended, now=now, actor=actor, reason="its runner ended while its agent was down"
        )
        result = settle_in_flight(
            host.pk,
            present=set(inventory.runners),
            complete=inventory.complete,
            now=now,
            actor=actor,
        )
        settled = len(cancelled) + len(result.lines)
        # Issue 21 item 20: an adopted workload of a runner failed because this host was
        # lost ran on; its row and its job are put back to the truth.
        revived = runner_side().adopted_after_loss(
            host, runner_ids=inventory.runners, now=now, actor=actor
        )
        audit.record(
            actor=actor,
            action="host.inventory",
            target=host,
            detail={
                "runners": len(inventory.runners),
                "complete": inventory.complete,
                "settled": settled,
                "revived": len(revived),
            },
            at=now,
        )
    # Outside: each abandoned stop fails its runner in a transaction of its own (TASK-05).
    # An abandoned create's runner is in the answer instead: the agent reports it missing.
    runner_side().tasks_abandoned(
        [t for t in result.abandoned if t.kind != TaskKind.CREATE_RUNNER], now=now
    )
    expected = runner_side().expected_runners(host, now)
    return protocol.InventoryAnswer(settled=settled, runners=tuple(expected))
