"""The machine state machine: its allow-list and its compare-and-set (MACH-01..03)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection

from fleet.models import Machine
from fleet.states import MACHINE_TRANSITIONS, MachineState
from fleet.transitions import transition_machine

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
SPEC_STATES = {
    "planned", "creating", "starting", "bootstrapping", "enrolling", "ready",
    "draining", "deleting", "deleted", "failed", "quarantined",
}  # fmt: skip
SPEC_EDGES = {
    ("planned", "creating"), ("creating", "starting"), ("creating", "bootstrapping"),
    ("starting", "bootstrapping"), ("bootstrapping", "enrolling"), ("enrolling", "ready"),
    ("ready", "draining"), ("draining", "ready"), ("ready", "deleting"),
    ("draining", "deleting"), ("deleting", "deleted"), ("planned", "failed"),
    ("creating", "failed"), ("bootstrapping", "failed"), ("enrolling", "failed"),
    ("failed", "deleting"), ("creating", "quarantined"), ("ready", "quarantined"),
    ("deleting", "quarantined"), ("quarantined", "deleted"),
}  # fmt: skip


def test_mach01_mach02_states_and_allow_list_are_exactly_the_spec():
    assert {s.value for s in MachineState} == SPEC_STATES
    assert {(a.value, b.value) for a, b in MACHINE_TRANSITIONS} == SPEC_EDGES


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("src", "dst"), list(itertools.product(list(MachineState), list(MachineState)))
)
def test_mach03_every_pair_of_machine_states_is_checked(src, dst):
    machine = Machine.objects.create(
        name="zoomies-m1", provider="fake", state=src, created_at=T0, state_changed_at=T0
    )
    moved = transition_machine(machine.pk, dst, now=T0, actor="test")
    machine.refresh_from_db()
    if (src.value, dst.value) in SPEC_EDGES:
        assert moved and machine.state == dst
    else:
        assert not moved and machine.state == src


@pytest.mark.django_db
def test_mach03_a_dropped_machine_edge_is_logged(caplog):
    machine = Machine.objects.create(
        name="zoomies-m1", provider="fake", state="quarantined", created_at=T0, state_changed_at=T0
    )
    with caplog.at_level("WARNING", logger="zoomies.fleet"):
        assert not transition_machine(machine.pk, "deleting", now=T0, actor="system:machines")
    assert "dropped illegal transition quarantined -> deleting" in caplog.text


@pytest.mark.django_db
def test_mach01_the_database_rejects_an_unknown_machine_state():
    machine = Machine.objects.create(
        name="zoomies-m1", provider="fake", created_at=T0, state_changed_at=T0
    )
    with pytest.raises(IntegrityError):
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Machine._meta.db_table} SET state = 'rebooting' WHERE id = %s",
                [machine.pk],
            )
