"""The constants' relationships, pinned at the defaults ("What holds them together").

Each test goes red if a default changes in a way that breaks the relationship the spec says it
was chosen against; validate() enforces the same relationships on an operator's values.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from zoomies_site import registry


@pytest.fixture
def d():
    return registry.layered(defaults_only=True)


def test_host_05_the_silence_ladder_is_ordered(d):
    """HOST-05: one slow heartbeat never makes a host unhealthy; lost comes after unhealthy."""
    assert d["agent.heartbeat_timeout"] >= 3 * d["agent.heartbeat_interval"]
    assert d["host.lost_after"] > d["agent.heartbeat_timeout"]
    # HOST-02: the validator's limit is half the timeout, 45 s at the default 90 s.
    assert d["agent.max_quiet_heartbeat_interval"] == timedelta(seconds=45)
    assert d["agent.heartbeat_interval"] <= d["agent.max_quiet_heartbeat_interval"]
    # Both judgements are made on the housekeeping tick, which must come round in time.
    assert d["housekeeping.tick"] <= d["agent.heartbeat_timeout"] / 2


def test_task_12_every_lease_outlasts_the_work_it_covers(d):
    """TASK-12: a shorter lease would offer the task again while the first attempt runs."""
    assert d["tasks.create_lease"] > d["agent.create_timeout"]
    assert d["tasks.stop_lease"] > d["runners.drain_grace"] + d["agent.stop_margin"]
    assert d["tasks.remove_lease"] > d["agent.remove_timeout"]
    # TASK-09: the host check's own lease is above the agent's limit on one run.
    assert d["tasks.host_check_lease"] > d["agent.host_check_run_timeout"]


def test_conf_07_the_provision_timeout_is_bounded_on_both_sides(d):
    """CONF-07: longer than create + Docker wait, no longer than the create lease."""
    provision = d["scheduler.provision_timeout"]
    assert provision > d["agent.create_timeout"] + d["runners.docker_wait"]
    assert provision <= d["tasks.create_lease"]
    assert provision == timedelta(minutes=20) == d["tasks.create_lease"]


def test_sched_18_not_progressing_fires_at_half_the_provision_timeout_after_the_docker_wait(d):
    """SCHED-18: 10 min at the default, and after the 180 s Docker wait (CONF-07)."""
    assert d["runners.not_progressing"] == d["scheduler.provision_timeout"] / 2
    assert d["runners.not_progressing"] == timedelta(minutes=10)
    assert d["runners.not_progressing"] > d["runners.docker_wait"]


def test_host_21_the_throttle_ladder_is_paced_against_its_measurements(d):
    """HOST-21: recovery > usage max age, step >= hold window, stale reset > host lost."""
    assert d["scheduler.throttle_recovery"] > d["store.host_usage_max_age"]
    assert d["scheduler.throttle_step"] >= d["store.cpu_hold_window"]
    assert d["scheduler.stale_throttle_reset"] > d["host.lost_after"]
    assert d["store.min_cpu_factor"] >= 0.5
    # Each rung takes a quarter of the CPU quota down to the floor, which two rungs reach.
    assert 1 - 0.25 * 2 == d["store.min_cpu_factor"]
    assert d["store.max_throttle_level"] == 3


def test_sched_22_the_start_backoff_never_outlasts_the_failures_it_is_computed_from(d):
    """SCHED-22: 10 s, doubling, capped at 5 min and never longer than the 10-min retention."""
    assert d["scheduler.start_backoff"] == timedelta(seconds=10)
    assert d["scheduler.start_backoff"] <= d["scheduler.max_start_backoff"]
    assert d["scheduler.max_start_backoff"] <= d["scheduler.failed_retention"]


def test_task_03_04_lease_lengths_and_attempts_give_up_on_a_host_in_time(d):
    """TASK-03/04: 20/10/5-min leases, 3 offers: 1 h for a create, 30 min stop, 15 min remove."""
    attempts = d["tasks.max_attempts"]
    assert attempts == 3
    assert attempts * d["tasks.create_lease"] == timedelta(hours=1)
    assert attempts * d["tasks.stop_lease"] == timedelta(minutes=30)
    assert attempts * d["tasks.remove_lease"] == timedelta(minutes=15)


def test_task_10_11_host_checks_are_dropped_and_cooled_down_quickly(d):
    """TASK-10/11: a check not taken within 20 s is dropped; another may follow after 15 s."""
    assert d["tasks.host_check_pending_ttl"] == timedelta(seconds=20)
    assert d["tasks.host_check_cooldown"] == timedelta(seconds=15)
    assert d["tasks.host_check_pending_ttl"] < d["tasks.host_check_lease"]


def test_sched_32_automatic_pools_wait_out_more_than_host_lost(d):
    """SCHED-32: 10 min, above the 5-min host-lost time."""
    assert d["scheduler.auto_pools_host_grace"] > d["host.lost_after"]


def test_the_controller_lease_is_renewed_well_inside_its_length(d):
    """One controller per database: one missed renewal must not let the lease lapse."""
    assert d["controller.lease_renew"] < d["controller.lease_ttl"] / 2


def test_a_rate_limit_stand_down_is_capped_at_githubs_hour(d):
    assert d["github.rate_limit_fallback"] <= d["github.rate_limit_cap"] == timedelta(hours=1)


def test_the_defaults_satisfy_every_relationship_validate_checks(d):
    assert [f for f in registry.validate(d) if f.key.startswith("config.") and f.is_error] == []
