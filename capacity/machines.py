"""The machine loop: rented hosts grown from the scheduler's unmet demand and given back when
idle (MACH-11..15, MACH-19).

It lives here, above `runners` and `fleet`, because it reads both: the scheduler's decision
on the same snapshot the reconcile pass builds (which runners no host can take), and the
fleet's machines, hosts and providers. It runs as its own django-q2 task under its own lease
row ("machines", STORE-07), so a reconcile pass waiting on GitHub never delays it (MACH-19).

`step(now)` is one round: the snapshot, the pure planner (`fleet.machine_planner`), its plan
applied (planned rows, drains, cancelled drains), then one lifecycle move per machine
(`fleet.machines.step_machine`) against its provider.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max

from accounts import audit
from fleet import actions as fleet_actions
from fleet import provider_actions, provider_setups
from fleet.machine_planner import (
    MachinePlan,
    MachineSnapshot,
    MachineView,
    PoolDemand,
    ProviderView,
    plan_machines,
)
from fleet.machines import ACTOR, HostFacts, Timeouts, claim_hash, plan_machine, step_machine
from fleet.models import Host, Machine, MachineProvider
from fleet.providers.contract import Mark, Provider, ProviderError
from fleet.states import MachineState as M
from fleet.transitions import transition_machine
from runners.models import Runner
from runners.reconcile import build_snapshot as build_scheduling_snapshot
from runners.scheduler import assign_jobs, decide
from runners.scheduler.model import AVAILABLE_STATES, TERMINAL_STATES
from runners.states import LIVE_STATES
from zoomies_site.core import registry, sealing

log = logging.getLogger("zoomies.machines")

LEASE_NAME = "machines"
LEASE_TTL = timedelta(minutes=2)
# A failed machine is swept for a resource that appeared after all (MACH-10) this long.
FAILED_SWEEP = timedelta(hours=1)


def controller_mark() -> Mark:
    """This controller's ownership mark: one per installation (its signing key), so two
    controllers sharing a provider never take each other's machines for their own."""
    digest = hashlib.sha256(f"zoomies-mark:{settings.SECRET_KEY}".encode()).hexdigest()
    return Mark(f"zoomies-{digest[:12]}")


# -- providers -----------------------------------------------------------------------------

# By provider name: the configuration it was built from, and the implementation.
_providers: dict[str, tuple[str, Provider]] = {}


def provider_for(row: MachineProvider) -> Provider:
    """The implementation of a configured provider, one per process; built again when the
    provider's settings change (an operator's PATCH), the old one dropped."""
    built_from = row.kind + repr(sorted(row.config.items()))
    held = _providers.get(row.name)
    if held is not None and held[0] == built_from:
        return held[1]
    provider = _build(row)
    _providers[row.name] = (built_from, provider)
    return provider


def _build(row: MachineProvider) -> Provider:
    if row.kind == "fake":
        from fleet.providers.fake import FakeProvider  # noqa: PLC0415  # tests and the sandbox

        return FakeProvider(row.name)
    if row.kind == "local":
        from fleet.providers.local import LocalProvider  # noqa: PLC0415  # only where configured

        return LocalProvider(row.name, root=Path(settings.DATA_DIR) / "machines", **row.config)
    if row.kind == "proxmox":
        from fleet.providers.proxmox.provider import ProxmoxProvider  # noqa: PLC0415  # as above

        # A token from onboarding is sealed in the row; opened only here, in memory.
        return ProxmoxProvider.from_config(row.name, provider_setups.unsealed_config(row.config))
    raise ValueError(f"provider {row.name}: unknown kind {row.kind!r}")


@dataclass(frozen=True)
class ProviderTest:
    """A saved provider asked whether it could rent a machine now (the Settings page's
    "Test connection"): `findings` names what would stop a create, `reason` why the provider
    could not be asked at all (fleet.provider_setups.failure_reason), empty when it was."""

    findings: list[str]
    reason: str = ""
    detail: str = ""


def test_provider(row: MachineProvider, *, actor: str, now: datetime) -> ProviderTest:
    """One look through a provider built afresh from the row (the loop's own instance and
    its in-flight bookkeeping are left alone), closed after; audited with its outcome."""
    try:
        provider = _build(row)
    # A token file gone, a sealed token the key no longer opens, a setting out of range.
    except (OSError, ValueError, KeyError, sealing.SealError) as exc:
        outcome = ProviderTest([], reason="refused", detail=f"its settings cannot be used: {exc}")
    else:
        try:
            check = getattr(provider, "check", None)
            findings = check() if check is not None else []
            if check is None:
                provider.list()
            outcome = ProviderTest(findings)
        except ProviderError as exc:
            reason = provider_setups.failure_reason(exc)
            outcome = ProviderTest([], reason=reason, detail=str(exc))
        finally:
            client = getattr(provider, "client", None)
            if client is not None:
                client.close()
    verdict = outcome.reason or ("ok" if not outcome.findings else "findings")
    with transaction.atomic(durable=True):
        audit.record(
            actor=actor, action="provider.test", target=row,
            detail={"outcome": verdict, "findings": outcome.findings}, at=now,
        )  # fmt: skip
    return outcome


def controller_url() -> str:
    """Where a rented machine's agent dials: machines.controller_url, or for a machine on
    this very box, the controller's own loopback listener."""
    url: str = registry.get("machines.controller_url")
    if url:
        return url
    port = (Path(settings.DATA_DIR) / "internal-port").read_text().strip()
    return f"http://127.0.0.1:{port}"


def bootstrap_for(machine: Machine) -> dict[str, str]:
    """What the machine's agent needs to join: the URL and a single-use claim code bound to
    its name. Only the code's hash is kept (on the row); the code goes to the provider."""
    code = secrets.token_urlsafe(32)
    Machine.objects.filter(pk=machine.pk).update(claim_hash=claim_hash(code))
    return {"controller_url": controller_url(), "claim_code": code, "name": machine.name}


def redeem_machine_claim(*, claim_code: str, name: str, now: datetime) -> bool:
    """Spend a machine's claim code for the host joining as `name`; False when the code is
    no machine's (it may be a scale-up event's). A compare-and-set spends it once."""
    hashed = claim_hash(claim_code) if claim_code else ""
    if not hashed:
        return False
    with transaction.atomic():
        spent = Machine.objects.filter(
            claim_hash=hashed, name=name, state__in=[M.CREATING, M.STARTING, M.BOOTSTRAPPING,
                                                     M.ENROLLING]
        ).update(claim_hash="")  # fmt: skip
        if spent:
            machine = Machine.objects.get(name=name)
            audit.record(actor=f"agent:{name}", action="machine.claim.redeemed", target=machine,
                         detail={"host_name": name}, at=now)  # fmt: skip
    return bool(spent)


# -- one round -----------------------------------------------------------------------------


@dataclass
class Round:
    plan: MachinePlan = field(default_factory=MachinePlan)
    lines: list[str] = field(default_factory=list)
    down: dict[str, str] = field(default_factory=dict)  # provider -> why


def step(now: datetime) -> Round:
    result = Round()
    rows = {p.name: p for p in MachineProvider.objects.all()}
    machines = list(Machine.objects.exclude(state=M.DELETED).select_related("host"))
    if not rows and not machines:
        return result
    snapshot = build_snapshot(now, rows, machines, result)
    result.plan = plan_machines(snapshot)
    apply(result.plan, now=now, lines=result.lines)
    timeouts = Timeouts(join=registry.get("machines.join_timeout"))
    facts = host_facts([m.host_id for m in machines if m.host_id])
    _probe_before_creates(rows, result)
    for machine in Machine.objects.exclude(state__in=[M.DELETED, M.QUARANTINED]).select_related(
        "host"
    ):
        if machine.state == M.FAILED and now - machine.state_changed_at > FAILED_SWEEP:
            continue
        row = rows.get(machine.provider)
        if row is None or machine.provider in result.down or not row.enabled:
            # MACH-15: only configured, enabled providers are asked; a down one is left
            # alone. A create never issued is given up once it is overdue (MACH-11).
            why = (
                "it is no longer configured" if row is None
                else "it is disabled" if not row.enabled
                else result.down[machine.provider]
            )  # fmt: skip
            _give_up_unissued(machine, now, timeouts, f"provider {machine.provider}: {why}",
                              result.lines)  # fmt: skip
            continue
        try:
            line = step_machine(
                machine,
                provider_for(row),
                mark=controller_mark(),
                now=now,
                timeouts=timeouts,
                bootstrap=bootstrap_for,
                host_facts=lambda m: facts.get(m.host_id, HostFacts(exists=False)),
                cordon=lambda host: fleet_actions.set_host_cordon(
                    host=host, cordoned=True, now=now, actor=ACTOR
                ),
            )
        except ProviderError as exc:
            result.down[machine.provider] = str(exc)
            log.warning("machines: provider %s: %s", machine.provider, exc)
            continue
        except Exception:  # one machine's fault must not stop the others' round
            log.exception("machines: %s: its step failed", machine.name)
            continue
        if line:
            result.lines.append(line)
    record_outages(rows, result, now)
    return result


def record_outages(rows: dict[str, MachineProvider], result: Round, now: datetime) -> None:
    """Issue 23 item 7: each provider found down this round is recorded on its row (the
    problems list reads it there). One recorded down that this round did not find down is
    asked the probe's cheap question before its record is cleared: a provider with no work
    this round was asked nothing else, and silence is not an answer."""
    for name, row in rows.items():
        if name not in result.down and row.down_since is not None and row.enabled:
            try:
                provider_for(row).inspect("zm-probe")
            except ProviderError as exc:
                result.down[name] = str(exc)
            else:
                provider_actions.clear_outage(row, now=now, actor=ACTOR)
        if name in result.down:
            provider_actions.record_outage(row, error=result.down[name], now=now, actor=ACTOR)


def _probe_before_creates(rows: dict[str, MachineProvider], result: Round) -> None:
    """A provider about to be asked for a create is asked a cheap question first: one that
    cannot answer it is down, and no create is issued to it this round (so a machine it
    never got stays planned, not creating with an outcome nobody can know)."""
    waiting = set(Machine.objects.filter(state=M.PLANNED).values_list("provider", flat=True))
    for name in sorted(waiting & set(rows)):
        if name in result.down or not rows[name].enabled:
            continue
        try:
            provider_for(rows[name]).inspect("zm-probe")
        except ProviderError as exc:
            result.down[name] = str(exc)


def _give_up_unissued(
    machine: Machine, now: datetime, timeouts: Timeouts, why: str, lines: list[str]
) -> None:
    if machine.state == M.PLANNED and now - machine.state_changed_at >= timeouts.create:
        reason = f"the create was never issued: {why}"
        if transition_machine(machine.pk, M.FAILED, now=now, actor=ACTOR, reason=reason,
                              message=reason):  # fmt: skip
            lines.append(f"{machine.name}: planned -> failed: {reason}")


def build_snapshot(
    now: datetime, rows: dict[str, MachineProvider], machines: list[Machine], result: Round
) -> MachineSnapshot:
    facts = host_facts([m.host_id for m in machines if m.host_id])
    idle = idle_since([m for m in machines if m.host_id])
    views = tuple(
        MachineView(
            id=m.pk,
            provider=m.provider,
            pool_id=m.pool_id,
            state=m.state,
            live_runners=facts.get(m.host_id, HostFacts(exists=False)).live_runners,
            idle_since=idle.get(m.pk),
        )
        for m in machines
    )
    providers = tuple(
        ProviderView(
            name=row.name,
            pools=frozenset(row.pools),
            max_machines=row.max_machines,
            max_per_pool=row.max_per_pool,
            slots_per_machine=row.slots_per_machine,
            enabled=row.enabled,
            down=row.name in result.down,
        )
        for row in rows.values()
    )
    return MachineSnapshot(
        now=now,
        providers=providers,
        machines=views,
        demand=unmet_demand(now),
        idle_timeout=registry.get("machines.idle_timeout"),
        max_total=registry.get("machines.max_total"),
    )


def unmet_demand(now: datetime) -> tuple[PoolDemand, ...]:
    """Per pool, the runners queued jobs want that this round's scheduling would place
    nowhere: jobs less the runners that stand for them less the creates the scheduler would
    make, within the pool's cap; nothing for a paused pool."""
    sched = build_scheduling_snapshot(now)
    decision = decide(sched)
    creates: dict[int, int] = {}
    for create in decision.creates:
        creates[create.pool_id] = creates.get(create.pool_id, 0) + 1
    jobs_by_pool = assign_jobs(sched.queued_jobs, sched.pools)
    demand = []
    for pool in sched.pools:
        if pool.paused:
            continue
        runners = [r for r in sched.runners if r.pool_id == pool.id]
        live = sum(1 for r in runners if r.state not in TERMINAL_STATES)
        available = sum(1 for r in runners if r.state in AVAILABLE_STATES)
        queued = len(jobs_by_pool.get(pool.id, ()))
        made = creates.get(pool.id, 0)
        wanted = max(0, queued - available - made)
        room = max(0, pool.max_runners - live - made)
        if min(wanted, room):
            demand.append(
                PoolDemand(
                    pool.id,
                    pool.name,
                    min(wanted, room),
                    f"{queued} queued job(s) and no host with room for "
                    f"{min(wanted, room)} more runner(s)",
                )
            )
    return tuple(demand)


def host_facts(host_ids: list[int]) -> dict[int, HostFacts]:
    live = dict(
        Runner.objects.filter(host_id__in=host_ids, state__in=LIVE_STATES)
        .values("host_id")
        .annotate(n=Count("pk"))
        .values_list("host_id", "n")
    )
    existing = set(Host.objects.filter(pk__in=host_ids).values_list("pk", flat=True))
    return {
        host_id: HostFacts(exists=host_id in existing, live_runners=live.get(host_id, 0))
        for host_id in host_ids
    }


def idle_since(machines: list[Machine]) -> dict[int, datetime]:
    """Since when each ready machine's host has had no live runner: the later of when it
    became ready and when its last runner ended."""
    host_ids = [m.host_id for m in machines]
    busy = set(
        Runner.objects.filter(host_id__in=host_ids, state__in=LIVE_STATES).values_list(
            "host_id", flat=True
        )
    )
    ended = dict(
        Runner.objects.filter(host_id__in=host_ids)
        .values("host_id")
        .annotate(at=Max("finished_at"))
        .values_list("host_id", "at")
    )
    found = {}
    for m in machines:
        if m.state != M.READY or m.host_id in busy:
            continue
        last = ended.get(m.host_id)
        found[m.pk] = max(m.state_changed_at, last) if last else m.state_changed_at
    return found


def apply(plan: MachinePlan, *, now: datetime, lines: list[str]) -> None:
    for new in plan.plans:
        machine = plan_machine(provider=new.provider, pool_id=new.pool_id, now=now,
                               reason=new.reason)  # fmt: skip
        lines.append(f"{machine.name}: planned: {new.reason}")
    for cancel in plan.cancels:
        if transition_machine(cancel.machine_id, M.READY, now=now, actor=ACTOR,
                              reason=cancel.reason, message=cancel.reason):  # fmt: skip
            _cordon(cancel.machine_id, False, now)
            lines.append(f"machine {cancel.machine_id}: drain cancelled: {cancel.reason}")
    for drain in plan.drains:
        if transition_machine(drain.machine_id, M.DRAINING, now=now, actor=ACTOR,
                              reason=drain.reason, message=drain.reason):  # fmt: skip
            _cordon(drain.machine_id, True, now)
            lines.append(f"machine {drain.machine_id}: draining: {drain.reason}")


def _cordon(machine_id: int, cordoned: bool, now: datetime) -> None:
    host = Host.objects.filter(machine__pk=machine_id).first()
    if host is not None:
        fleet_actions.set_host_cordon(host=host, cordoned=cordoned, now=now, actor=ACTOR)


def drain(machine: Machine, *, now: datetime, actor: str) -> bool:
    """An operator's word (MACH-14): a ready machine drains (its host cordoned); it is
    deleted once its last runner finishes, or taken back if demand returns first."""
    why = "drained on an operator's word"
    if not transition_machine(machine.pk, M.DRAINING, now=now, actor=actor, reason=why,
                              message=why):  # fmt: skip
        return False
    _cordon(machine.pk, True, now)
    return True


def retire(machine: Machine, *, now: datetime, actor: str) -> bool:
    """An operator's word (MACH-14): a ready or draining machine goes to deleting now; the
    loop deletes it only once an inspect proves it ours, and records it deleted only once
    one cannot find it."""
    why = "deleted on an operator's word"
    return transition_machine(machine.pk, M.DELETING, now=now, actor=actor, reason=why,
                              message=why)  # fmt: skip


def release(machine: Machine, *, now: datetime, actor: str) -> bool:
    """An operator's release of a quarantined machine (MACH-08): the row goes to deleted,
    the resource is left where it is (it could not be proved ours). Only from quarantined:
    a deleting machine goes to deleted after the inspect that proves it gone (MACH-09)."""
    return transition_machine(
        machine.pk,
        M.DELETED,
        now=now,
        actor=actor,
        expected_from=frozenset({M.QUARANTINED}),
        reason="released by an operator; its resource was left alone",
        message="released by an operator; its resource was left alone",
    )
