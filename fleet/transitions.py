"""The one place a machine's state is written (MACH-03), with the runners' discipline."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from accounts import audit
from fleet.models import Machine
from fleet.states import MachineState, can_transition_machine, machine_sources_of

log = logging.getLogger("zoomies.fleet")


def transition_machine(
    machine_id: int,
    new_state: str,
    *,
    now: datetime,
    actor: str,
    reason: str = "",
    message: str | None = None,
) -> bool:
    """Compare-and-set a machine's state; True only when this call moved it."""
    new_state = MachineState(new_state)
    with transaction.atomic():
        current = Machine.objects.filter(pk=machine_id).values_list("state", flat=True).first()
        if current is None or current == new_state:
            return False
        if not can_transition_machine(current, new_state):
            log.warning(
                "machine %s: dropped illegal transition %s -> %s (%s)",
                machine_id,
                current,
                new_state,
                reason or actor,
            )
            return False
        fields: dict = {"state": new_state, "state_changed_at": now}
        if message is not None:
            fields["message"] = message
        moved = Machine.objects.filter(
            pk=machine_id, state=current, state__in=machine_sources_of(new_state)
        ).update(**fields)
        if moved:
            audit.record(
                actor=actor,
                action=f"machine.{new_state}",
                target=Machine(pk=machine_id),
                detail={"from": current, "to": new_state, "reason": reason},
                at=now,
            )
        return bool(moved)
