"""A rented machine's lifecycle against its provider: one observation, one move (MACH-04..16).

`step_machine` looks at one machine row and the provider, and makes at most one move of the
machine state machine (`fleet.transitions.transition_machine`, the one writer), each move
following from something the provider said, never from an intent (MACH-05):

- planned: the identity is written down (planned -> creating) before the create is issued
  (MACH-04); a create refused is failed, a create whose answer was lost stays creating.
- creating: who owns the identity? Ours -> starting/bootstrapping; somebody else's ->
  quarantined; nobody's, past `create_timeout` -> failed (and a later sweep that finds it
  after all deletes it, MACH-10). Never a second create (MACH-06).
- starting -> bootstrapping once running; bootstrapping -> enrolling once the guest is up
  (its agent was handed its claim code at the create); enrolling -> ready once a host of the
  machine's name has joined (MACH-12), failed past `join_timeout` (MACH-11).
- ready: still ours (else quarantined, MACH-07); its host gone -> deleting (MACH-14).
- draining: its host cordoned; once no live runner is left -> deleting.
- deleting: delete only what an inspect proves ours (MACH-16); deleted only once an inspect
  cannot find it (MACH-09); quarantined if that never happens within `delete_timeout`.
- failed: swept; a resource found (ours) -> deleting (MACH-10).
- quarantined: nothing, ever (MACH-08); only an operator's release.

No fleet policy here (how many machines, which to drain): that is the planner's. The caller
hands in the facts about hosts (`HostFacts`), so this module reads no runner rows.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from accounts import audit
from fleet.models import Host, Machine
from fleet.providers.contract import (
    MachineSpec,
    Mark,
    Observed,
    OutcomeUnknown,
    Power,
    Provider,
    ProviderError,
)
from fleet.states import MachineState as M
from fleet.transitions import transition_machine

# The words a machine whose create the provider refused is failed with (fleet.problems
# counts them per provider).
REFUSED_CREATE = "the provider refused the create: "

log = logging.getLogger("zoomies.machines")

ACTOR = "system:machines"


@dataclass(frozen=True)
class Timeouts:
    """How long each wait may last before the machine is given up on."""

    create: timedelta = timedelta(minutes=10)
    boot: timedelta = timedelta(minutes=10)
    join: timedelta = timedelta(minutes=10)
    delete: timedelta = timedelta(minutes=10)
    # A delete asked for and not yet seen through is asked again this often.
    redelete: timedelta = timedelta(seconds=30)


@dataclass(frozen=True)
class HostFacts:
    """What the loop knows of the machine's host: whether it exists, and its live runners."""

    exists: bool
    live_runners: int = 0


def claim_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def plan_machine(*, provider: str, pool_id: int | None, now: datetime, reason: str) -> Machine:
    """The row, in `planned`, before any resource exists (MACH-04). Its name is also the
    identity the create will use: chosen here, in advance, so a lost create answer can be
    resolved by asking who owns it."""
    with transaction.atomic():
        machine = Machine.objects.create(
            name=f"zm-{secrets.token_hex(5)}",
            provider=provider,
            pool_id=pool_id,
            message=reason,  # the state is the model's default: planned
            created_at=now,
            state_changed_at=now,
        )
        audit.record(
            actor=ACTOR,
            action="machine.planned",
            target=machine,
            detail={"provider": provider, "pool_id": pool_id, "reason": reason},
            at=now,
        )
    return machine


def step_machine(
    machine: Machine,
    provider: Provider,
    *,
    mark: Mark,
    now: datetime,
    timeouts: Timeouts,
    bootstrap: Callable[[Machine], dict[str, str]],
    host_facts: Callable[[Machine], HostFacts],
    cordon: Callable[[Host], None],
) -> str:
    """One move for `machine`, or none; a sentence saying what happened (empty: nothing).
    A ProviderError other than a lost create answer is left to the caller (the provider is
    down or refusing; the machine stays as it is)."""
    step = _STEPS.get(machine.state)
    if step is None:
        return ""
    context = _Context(machine, provider, mark, now, timeouts, bootstrap, host_facts, cordon)
    return step(context)


@dataclass
class _Context:
    machine: Machine
    provider: Provider
    mark: Mark
    now: datetime
    timeouts: Timeouts
    bootstrap: Callable[[Machine], dict[str, str]]
    host_facts: Callable[[Machine], HostFacts]
    cordon: Callable[[Host], None]

    def move(self, to: str, why: str, **fields) -> str:
        moved = transition_machine(
            self.machine.pk, to, now=self.now, actor=ACTOR, reason=why, message=why, fields=fields
        )
        if not moved:
            return ""
        log.info("machine %s: %s -> %s: %s", self.machine.name, self.machine.state, to, why)
        return f"{self.machine.name}: {self.machine.state} -> {to}: {why}"

    def waited(self, limit: timedelta) -> bool:
        return self.now - self.machine.state_changed_at >= limit


def _planned(c: _Context) -> str:
    machine = c.machine
    # What the guest needs first: a fault here leaves the machine planned, nothing issued.
    spec = MachineSpec(identity=machine.name, mark=c.mark, bootstrap=c.bootstrap(machine))
    # MACH-04: the identity is on the row, and the row says a create may have happened,
    # before the call is made; a crash after this line leaves `creating`, never a duplicate.
    if not c.move(M.CREATING, "identity written down; creating", identity=machine.name,
                  create_issued_at=c.now):  # fmt: skip
        return ""
    machine.state, machine.identity, machine.create_issued_at = M.CREATING, machine.name, c.now
    try:
        observed = c.provider.create(spec)
    except OutcomeUnknown as exc:
        # MACH-05: not evidence either way; the next step asks who owns the identity.
        why = f"the create's answer was lost ({exc}); asking who owns {machine.identity}"
        Machine.objects.filter(pk=machine.pk, state=M.CREATING).update(message=why)
        return f"{machine.name}: {why}"
    except ProviderError as exc:
        return c.move(M.FAILED, f"{REFUSED_CREATE}{exc}")
    return _observed_after_create(c, observed)


def _observed_after_create(c: _Context, observed: Observed) -> str:
    if not observed.ours(c.mark):
        # MACH-07: something answers to our identity without our mark; nothing we can prove
        # is ours, so nothing automatic touches it again.
        return c.move(M.QUARANTINED, f"{observed.identity} exists without our mark")
    if observed.power == Power.RUNNING:
        return c.move(M.BOOTSTRAPPING, "the provider reports it running")
    return c.move(M.STARTING, f"the provider reports it {observed.power}")


def _creating(c: _Context) -> str:
    machine = c.machine
    observed = c.provider.inspect(machine.identity)  # MACH-06: ask, never create again
    if observed is not None:
        return _observed_after_create(c, observed)
    if machine.create_issued_at is None or c.now - machine.create_issued_at >= c.timeouts.create:
        return c.move(
            M.FAILED,
            f"no machine answers to {machine.identity} {_span(c.timeouts.create)} after the "
            "create (a later sweep deletes it if it appears)",
        )
    return ""


def _starting(c: _Context) -> str:
    observed = c.provider.inspect(c.machine.identity)
    if observed is None or not observed.ours(c.mark):
        return ""  # starting has no way out but up; the sweep and the problems list see it
    if observed.power == Power.RUNNING:
        return c.move(M.BOOTSTRAPPING, "it is up")
    if observed.power == Power.STOPPED:
        c.provider.start(c.machine.identity)
    return ""


def _bootstrapping(c: _Context) -> str:
    observed = c.provider.inspect(c.machine.identity)
    if observed is not None and observed.ours(c.mark) and observed.power == Power.RUNNING:
        # Its agent was handed the claim code with the create: it has its credential.
        return c.move(M.ENROLLING, "the guest is up with its agent's claim code")
    if c.waited(c.timeouts.boot):
        return c.move(M.FAILED, f"the guest never came up within {_span(c.timeouts.boot)}")
    return ""


def _enrolling(c: _Context) -> str:
    host = Host.objects.filter(name=c.machine.name).first()
    if host is not None and host.joined_at is not None and host.joined_at >= c.machine.created_at:
        return c.move(M.READY, f"its agent joined as host {host.name}", host=host)
    if c.waited(c.timeouts.join):
        return c.move(M.FAILED, f"its agent never joined within {_span(c.timeouts.join)}")
    return ""


def _ready(c: _Context) -> str:
    if not c.host_facts(c.machine).exists:
        return c.move(M.DELETING, "its host is gone")
    observed = c.provider.inspect(c.machine.identity)
    if observed is not None and not observed.ours(c.mark):
        return c.move(M.QUARANTINED, f"{observed.identity} no longer carries our mark")
    return ""


def _draining(c: _Context) -> str:
    host = c.machine.host
    if host is not None and not host.cordoned:
        c.cordon(host)  # MACH-12: no new runner lands on a draining machine
    facts = c.host_facts(c.machine)
    if facts.exists and facts.live_runners:
        return ""
    return c.move(M.DELETING, "its last runner finished")


def _deleting(c: _Context) -> str:
    machine = c.machine
    observed = c.provider.inspect(machine.identity)
    if observed is None:
        return c.move(M.DELETED, "the provider no longer has it")  # MACH-09
    if not observed.ours(c.mark):
        return c.move(M.QUARANTINED, f"{observed.identity} is not ours: not deleted")  # MACH-16
    first = machine.delete_issued_at
    if first is not None and c.now - first >= c.timeouts.delete:
        return c.move(
            M.QUARANTINED, f"still there {_span(c.timeouts.delete)} after its delete"
        )  # MACH-07
    last = machine.delete_asked_at
    if last is None or c.now - last >= c.timeouts.redelete:
        c.provider.delete(machine.identity)
        Machine.objects.filter(pk=machine.pk).update(
            delete_issued_at=first or c.now, delete_asked_at=c.now
        )
        return f"{machine.name}: delete asked for"
    return ""


def _failed(c: _Context) -> str:
    identity = c.machine.identity
    if not identity:
        return ""  # the create was never issued: nothing can exist
    observed = c.provider.inspect(identity)
    if observed is not None and observed.ours(c.mark):
        return c.move(M.DELETING, "a sweep found its resource after all")  # MACH-10
    return ""


_STEPS: dict[str, Callable[[_Context], str]] = {
    M.PLANNED: _planned,
    M.CREATING: _creating,
    M.STARTING: _starting,
    M.BOOTSTRAPPING: _bootstrapping,
    M.ENROLLING: _enrolling,
    M.READY: _ready,
    M.DRAINING: _draining,
    M.DELETING: _deleting,
    M.FAILED: _failed,
}


def _span(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    return f"{seconds // 60} min" if seconds >= 120 else f"{seconds} s"
