"""The runner state machine: the allow-list, the compare-and-set, and the idle clock."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection

from accounts.models import AuditLog
from runners.models import Pool, Runner
from runners.scheduler import model
from runners.states import DRAWN_EDGES, LIVE_STATES, RUNNER_TRANSITIONS, RunnerState
from runners.transitions import transition_runner

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
S = RunnerState
ALL_STATES = list(S)

# The spec's drawing, written out again by hand so a wrong edge in the code shows up here.
SPEC_DRAWN = {
    ("provisioning", "registering"),
    ("registering", "idle"),
    ("registering", "busy"),
    ("idle", "busy"),
    ("busy", "idle"),
    ("idle", "draining"),
    ("busy", "draining"),
    ("provisioning", "draining"),
    ("registering", "draining"),
    ("provisioning", "failed"),
    ("registering", "failed"),
    ("draining", "removed"),
    ("failed", "removed"),
}
SPEC_LIVE = {"provisioning", "registering", "idle", "busy", "draining"}
SPEC_ALLOWED = SPEC_DRAWN | {(s, end) for s in SPEC_LIVE for end in ("failed", "removed")}


@pytest.fixture
def pool(db):
    return Pool.objects.create(name="zoomies-linux-x64", labels=["linux"], ephemeral=False)


def make_runner(pool, state, *, name=None, ephemeral=None):
    return Runner.objects.create(
        name=name or f"zoomies-linux-x64-{state}",
        pool=pool,
        state=state,
        created_at=T0,
        state_changed_at=T0,
        ephemeral=pool.ephemeral if ephemeral is None else ephemeral,
    )


def test_run02_run03_the_allow_list_is_exactly_the_drawn_edges_plus_live_to_terminal():
    """RUN-02, RUN-03."""
    assert {(a.value, b.value) for a, b in DRAWN_EDGES} == SPEC_DRAWN
    assert {s.value for s in LIVE_STATES} == SPEC_LIVE
    assert {(a.value, b.value) for a, b in RUNNER_TRANSITIONS} == SPEC_ALLOWED


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), list(itertools.product(ALL_STATES, ALL_STATES)))
def test_run05_run06_every_pair_of_states_is_checked_against_the_allow_list(pool, src, dst):
    """RUN-05, RUN-06, RUN-08: every (from, to) pair through the one compare-and-set."""
    runner = make_runner(pool, src)
    result = transition_runner(runner.pk, dst, now=T0 + timedelta(minutes=1), actor="test")
    runner.refresh_from_db()
    if src == dst:
        assert not result.changed and not result.dropped
        assert runner.state == src
    elif (src.value, dst.value) in SPEC_ALLOWED:
        assert result.changed, f"{src}->{dst} should be allowed"
        assert runner.state == dst
    else:
        assert result.dropped, f"{src}->{dst} should be dropped"
        assert runner.state == src
        assert runner.state_changed_at == T0


@pytest.mark.django_db
def test_run07_a_repeated_state_changes_nothing_not_even_the_idle_clock(pool):
    runner = make_runner(pool, S.IDLE)
    audits = AuditLog.objects.count()
    result = transition_runner(runner.pk, S.IDLE, now=T0 + timedelta(hours=1), actor="agent:x")
    runner.refresh_from_db()
    assert not result.changed
    assert runner.state_changed_at == T0
    assert AuditLog.objects.count() == audits


@pytest.mark.django_db
def test_run08_an_illegal_edge_is_dropped_with_a_log_line(pool, caplog):
    """A runner that already ended, asked to move again, is an expected race: a debug line
    (issue 21 item 21); an illegal edge from a live state is a warning."""
    runner = make_runner(pool, S.REMOVED)
    with caplog.at_level("DEBUG", logger="zoomies.runners"):
        result = transition_runner(runner.pk, S.BUSY, now=T0, actor="agent:x")
    assert result.dropped
    (line,) = [r for r in caplog.records if "dropped illegal transition" in r.getMessage()]
    assert "removed -> busy" in line.getMessage() and line.levelname == "DEBUG"
    runner.refresh_from_db()
    assert runner.state == S.REMOVED
    live = make_runner(pool, S.IDLE)
    caplog.clear()
    with caplog.at_level("DEBUG", logger="zoomies.runners"):
        assert transition_runner(live.pk, S.REGISTERING, now=T0, actor="agent:x").dropped
    (line,) = [r for r in caplog.records if "dropped illegal transition" in r.getMessage()]
    assert line.levelname == "WARNING"


@pytest.mark.django_db
def test_run09_finished_at_is_stamped_once_on_the_first_terminal_entry(pool):
    runner = make_runner(pool, S.REGISTERING)
    transition_runner(runner.pk, S.FAILED, now=T0 + timedelta(minutes=1), actor="t", message="x")
    transition_runner(runner.pk, S.REMOVED, now=T0 + timedelta(minutes=11), actor="t")
    runner.refresh_from_db()
    assert runner.state == S.REMOVED
    assert runner.finished_at == T0 + timedelta(minutes=1)
    assert runner.message == "x"


@pytest.mark.django_db
def test_run04_busy_to_idle_only_for_a_non_ephemeral_runner(pool):
    reusable = make_runner(pool, S.BUSY, name="zoomies-a", ephemeral=False)
    single_use = make_runner(pool, S.BUSY, name="zoomies-b", ephemeral=True)
    assert transition_runner(reusable.pk, S.IDLE, now=T0, actor="t").changed
    assert transition_runner(single_use.pk, S.IDLE, now=T0, actor="t").dropped


@pytest.mark.django_db
def test_run05_a_concurrent_writer_that_moved_the_row_wins(pool):
    """The UPDATE is guarded by the state read, so a stale caller cannot force an edge."""
    runner = make_runner(pool, S.IDLE)
    # Another writer moved the row to draining; a caller that still thinks it is idle
    # asks for busy, which draining does not allow.
    Runner.objects.filter(pk=runner.pk).update(state=S.DRAINING)
    result = transition_runner(runner.pk, S.BUSY, now=T0, actor="t")
    assert result.dropped
    runner.refresh_from_db()
    assert runner.state == S.DRAINING


@pytest.mark.django_db
def test_run01_the_database_rejects_an_unknown_state(pool):
    runner = make_runner(pool, S.IDLE)
    with pytest.raises(IntegrityError):
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Runner._meta.db_table} SET state = %s WHERE id = %s",
                ["sleeping", runner.pk],
            )


@pytest.mark.django_db
def test_every_transition_writes_an_audit_row(pool):
    runner = make_runner(pool, S.PROVISIONING)
    transition_runner(runner.pk, S.REGISTERING, now=T0, actor="agent:h1", reason="started")
    row = AuditLog.objects.get(action="runner.registering")
    assert row.actor == "agent:h1"
    assert row.detail == {"from": "provisioning", "to": "registering", "reason": "started"}


def test_run01_the_scheduler_spells_the_runner_states_as_the_model_does():
    """The scheduler cannot import the model's TextChoices (SCHED-01), so its copies of the
    state names are pinned here to the one source."""

    names = {
        model.PROVISIONING, model.REGISTERING, model.IDLE, model.BUSY, model.DRAINING,
        model.FAILED, model.REMOVED,
    }  # fmt: skip
    assert names == {s.value for s in RunnerState}
    assert {s for s in model.TERMINAL_STATES} == {"failed", "removed"}
