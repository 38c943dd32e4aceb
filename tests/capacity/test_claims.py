"""Claim codes and spawn records (ESC-01..05, ESC-07..09, ESC-20, ESC-23)."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import AuditLog
from capacity.claims import ClaimRefused, code_hash, controller_url, redeem_claim_code, render_body
from capacity.models import Attempt, ClaimCode, ProvisionOutcome, Spawn, SpawnState
from fleet.models import Host
from tests.capacity.conftest import make_pool, queue_jobs
from zoomies_site.core import registry

pytestmark = pytest.mark.django_db

FACTS = {"platform": "linux/x64", "backends": ["docker"], "capacity": 2, "version": "0.1.0"}


@pytest.fixture
def claiming(loop):
    loop.config = dataclasses.replace(
        loop.config, claim_codes=True, controller_url="https://zoomies.example"
    )
    # The join view reads the real clock: the test's clock starts there.
    loop.clock.now = timezone.now().replace(microsecond=0)
    return loop


def scale_up(loop, receiver):
    make_pool()
    queue_jobs(1, at=loop.clock.now)
    loop.step()
    return json.loads(receiver.arrivals[-1].body)


def join(client, name, code):
    return client.post(
        "/api/v1/agent/join",
        data=json.dumps({"name": name, "claim_code": code, **FACTS}),
        content_type="application/json",
    )


def test_esc01_a_scale_up_carries_a_claim_code_and_the_host_name_to_join_as(claiming, receiver):
    event = scale_up(claiming, receiver)
    assert event["host_name"].startswith("zoomies-spawn-")
    assert len(event["claim_code"]) == 64
    expires = claiming.clock.now + timedelta(seconds=300)  # claimTtlSeconds
    assert event["claim_expires_at"] == expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert event["controller_url"] == "https://zoomies.example"  # ESC-09
    assert event["schema_version"] == 1


def test_esc05_the_code_is_stored_only_as_a_hash_and_never_logged(
    claiming, receiver, client, caplog
):
    caplog.set_level(logging.DEBUG)
    event = scale_up(claiming, receiver)
    code = event["claim_code"]
    assert ClaimCode.objects.get().code_hash == code_hash(code) != code
    assert code not in Attempt.objects.get().body
    assert join(client, event["host_name"], code).status_code == 200
    assert join(client, event["host_name"], code).status_code == 401
    stored = json.dumps(list(AuditLog.objects.values_list("detail", flat=True)))
    assert code not in stored and code not in caplog.text
    # ... while every try of the attempt renders the same code into the same bytes.

    attempt = Attempt.objects.get()
    assert render_body(attempt.body, attempt.event_id) == receiver.arrivals[0].body


def test_esc03_esc07_the_agent_exchanges_the_code_at_join_and_the_spawn_ties_event_to_host(
    claiming, receiver, client
):
    event = scale_up(claiming, receiver)
    answer = join(client, event["host_name"], event["claim_code"])
    assert answer.status_code == 200 and answer.json()["agent_token"]
    host = Host.objects.get(name=event["host_name"])
    claiming.step(seconds=1)
    spawn = Spawn.objects.get()
    assert (spawn.state, spawn.host_id) == (SpawnState.ACTIVE, host.pk)
    assert spawn.attempt.event_id == event["event_id"]
    assert spawn.destination_url == receiver.url
    assert AuditLog.objects.filter(action="capacity.claim.redeemed").count() == 1


def test_esc04_a_second_redemption_is_refused_and_audited(claiming, receiver, client):
    event = scale_up(claiming, receiver)
    assert join(client, event["host_name"], event["claim_code"]).status_code == 200
    second = join(client, event["host_name"], event["claim_code"])
    assert second.status_code == 401
    refused = AuditLog.objects.get(action="capacity.claim.refused")
    assert refused.detail["reason"] == "spent" and refused.detail["host_name"] == event["host_name"]


def test_esc02_a_code_is_good_until_its_ttl_and_refused_after(claiming, receiver):
    event = scale_up(claiming, receiver)
    issued = claiming.clock.now
    with pytest.raises(ClaimRefused) as refused:
        redeem_claim_code(
            claim_code=event["claim_code"],
            name=event["host_name"],
            now=issued + timedelta(seconds=300),
        )
    assert refused.value.reason == "expired"
    spawn = redeem_claim_code(
        claim_code=event["claim_code"],
        name=event["host_name"],
        now=issued + timedelta(seconds=299),
    )
    assert spawn.host_name == event["host_name"]


def test_esc04_unknown_codes_and_other_names_are_refused(claiming, receiver):
    event = scale_up(claiming, receiver)
    now = claiming.clock.now
    for code, name, reason in [
        ("0" * 64, event["host_name"], "unknown"),
        (event["claim_code"], "zoomies-someone-else", "wrong-name"),
    ]:
        with pytest.raises(ClaimRefused) as refused:
            redeem_claim_code(claim_code=code, name=name, now=now)
        assert refused.value.reason == reason
    assert AuditLog.objects.filter(action="capacity.claim.refused").count() == 2
    assert ClaimCode.objects.get().redeemed_at is None


def test_esc08_a_claim_is_redeemed_from_the_shared_database_by_any_process(
    claiming, receiver, client
):
    """No state outside the database: a join served with empty in-process caches works."""
    event = scale_up(claiming, receiver)

    registry.reload()
    assert join(client, event["host_name"], event["claim_code"]).status_code == 200


def test_esc20_pending_codes_are_deleted_an_hour_after_they_expire(claiming, receiver):
    scale_up(claiming, receiver)
    first = ClaimCode.objects.get()
    first_event = first.spawn.attempt.event_id
    claiming.step(minutes=64)  # a sweep: the code expired 59 min ago
    assert ClaimCode.objects.filter(pk=first.pk).exists()
    claiming.step(seconds=59)  # not a sweep (ESC-14: once a minute)
    assert ClaimCode.objects.filter(pk=first.pk).exists()
    claiming.step(seconds=1)  # the next sweep, an hour to the second after it expired
    assert not ClaimCode.objects.filter(pk=first.pk).exists()

    # The provision's record outlives its code (its spawn record went with its teardown).
    assert ProvisionOutcome.objects.filter(event_id=first_event).exists()


def test_esc01_without_claim_codes_a_scale_up_carries_none(loop, receiver):
    event = scale_up(loop, receiver)
    assert "claim_code" not in event and not Spawn.objects.exists()


def test_esc03_a_join_with_neither_token_nor_code_is_still_refused(client):
    answer = client.post(
        "/api/v1/agent/join",
        data=json.dumps({"name": "h", **FACTS}),
        content_type="application/json",
    )
    assert answer.status_code == 401


def test_esc09_the_machine_dials_the_configured_url_else_the_controllers_own(
    loop, receiver, registry_defaults
):
    """ESC-09: with no capacity_demand.controller_url, the controller's listening URL."""

    assert controller_url(loop.config) == "http://127.0.0.1:8080"  # server.bind's default
    configured = dataclasses.replace(loop.config, controller_url="https://zoomies.example")
    assert controller_url(configured) == "https://zoomies.example"
    # Issue 27 item 6: else the controller's public URL, never the loopback bind.
    registry_defaults.set("server.public_url", "https://ci.example/")
    assert controller_url(loop.config) == "https://ci.example"
    assert controller_url(configured) == "https://zoomies.example"  # the destination's first
