"""The constants' relationships, pinned at the defaults ("What holds them together").

Each test goes red if a default changes in a way that breaks the relationship the spec says it
was chosen against; validate() enforces the same relationships on an operator's values.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from fleet.agent.backends import container
from zoomies_site.core import registry

DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "runner" / "Dockerfile"


@pytest.fixture
def d():
    return registry.layered(defaults_only=True)


def test_host_05_the_silence_ladder_is_ordered(d):
    """HOST-05: one slow heartbeat never makes a host unhealthy; lost comes after unhealthy."""
    assert d["agent.heartbeat_timeout"] >= 3 * d["agent.heartbeat_interval"]
    assert d["host.lost_after"] > d["agent.heartbeat_timeout"]
    # HOST-02: the validator's limit is half the timeout, 45 s at the default 90 s.
    assert (
        d["agent.heartbeat_interval"] <= d["agent.heartbeat_timeout"] / 2 == timedelta(seconds=45)
    )
    # Both judgements are made on the housekeeping tick, which must come round in time.
    assert d["housekeeping.tick"] <= d["agent.heartbeat_timeout"] / 2


# The timings in force on the other side: the agent's create timeout (AGENT-13) and the stock
# runner image's wait for its Docker daemon (BACK-10), which no registry entry sets today.
AGENT_CREATE_TIMEOUT = timedelta(seconds=container.DEFAULT_CREATE_TIMEOUT)
IMAGE_DOCKER_WAIT = timedelta(
    seconds=int(re.search(r"ZOOMIES_DOCKER_WAIT=(\d+)", DOCKERFILE.read_text()).group(1))
)


def test_task_12_every_lease_outlasts_the_work_it_covers(d):
    """TASK-12: a shorter lease would offer the task again while the first attempt runs."""
    assert d["tasks.create_lease"] > AGENT_CREATE_TIMEOUT
    assert d["tasks.stop_lease"] > d["runners.drain_grace"] + d["agent.stop_margin"]


def test_conf_07_the_provision_timeout_is_bounded_on_both_sides(d):
    """CONF-07: longer than create + Docker wait, no longer than the create lease."""
    provision = d["scheduler.provision_timeout"]
    assert provision > AGENT_CREATE_TIMEOUT + IMAGE_DOCKER_WAIT
    assert provision <= d["tasks.create_lease"]
    assert provision == timedelta(minutes=20) == d["tasks.create_lease"]


def test_sched_18_not_progressing_fires_at_half_the_provision_timeout_after_the_docker_wait(d):
    """SCHED-18: 10 min at the default, and after the image's Docker wait (CONF-07)."""
    assert d["runners.not_progressing"] == d["scheduler.provision_timeout"] / 2
    assert d["runners.not_progressing"] == timedelta(minutes=10)
    assert d["runners.not_progressing"] > IMAGE_DOCKER_WAIT


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


def test_the_controller_lease_is_renewed_well_inside_its_length(d):
    """One controller per database: one missed renewal must not let the lease lapse."""
    assert d["controller.lease_renew"] < d["controller.lease_ttl"] / 2


def test_a_rate_limit_stand_down_is_capped_at_githubs_hour(d):
    assert d["github.rate_limit_fallback"] <= d["github.rate_limit_cap"] == timedelta(hours=1)


def test_the_defaults_satisfy_every_relationship_validate_checks(d):
    assert [f for f in registry.validate(d) if f.key.startswith("config.") and f.is_error] == []
