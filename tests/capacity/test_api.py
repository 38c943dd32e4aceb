"""GET /api/v1/capacity/events: attempts with their tries, spawns, failures, and what each
pool waits for (CAP-15, ESC-29); viewer and above, read-only."""

from __future__ import annotations

import dataclasses
import json

import pytest
from django.utils import timezone

from accounts.models import User
from accounts.tokens import create_api_token
from capacity.backstop import record_provision_failure
from capacity.models import Attempt
from tests.capacity.conftest import make_pool, queue_jobs

pytestmark = pytest.mark.django_db
URL = "/api/v1/capacity/events"


@pytest.fixture
def viewer_client(client, viewer):
    """The cast's viewer, signed in."""
    client.force_login(viewer)
    return client


def test_esc29_the_api_lists_attempts_tries_spawns_failures_and_pool_waits(
    viewer_client, loop, receiver, django_assert_max_num_queries
):
    loop.config = dataclasses.replace(loop.config, claim_codes=True)
    loop.clock.now = timezone.now().replace(microsecond=0)
    make_pool()
    queue_jobs(1, at=loop.clock.now)
    receiver.script = [500]
    loop.step()
    loop.step(seconds=2)
    record_provision_failure(
        receiver.url, cause="zoomies-spawn-x never joined", now=loop.clock.now, config=loop.config
    )
    for _ in range(5):  # more rows must not mean more queries
        loop.step(minutes=5, seconds=31)
    with django_assert_max_num_queries(30):
        answer = viewer_client.get(URL)
    assert answer.status_code == 200
    data = answer.json()
    first = data["attempts"][-1]
    assert first["type"] == "capacity_demand" and first["state"] == "delivered"
    assert [(t["number"], t["outcome"], t["status_code"]) for t in first["tries"]] == [
        (1, "refused", 500),
        (2, "accepted", 204),
    ]
    assert first["event"]["event_id"] == first["event_id"]
    sent = json.loads(receiver.arrivals[0].body)["claim_code"]
    assert sent not in json.dumps(data)  # the claim code is shown as its placeholder only
    attempts = {a["event_id"] for a in data["attempts"]}
    assert data["spawns"] and {s["event_id"] for s in data["spawns"]} <= attempts
    [failures] = data["provision_failures"]
    assert failures["destination_url"] == receiver.url and failures["last_cause"]
    [pool] = data["pools"]
    assert pool["pool_name"] == "zoomies-linux-x64" and pool["waiting_for"]


def test_the_capacity_api_needs_the_read_scope_and_is_read_only(client, loop):
    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _r, reader = create_api_token(user=user, name="r", scopes=["fleet:read"], actor="test")
    _n, nothing = create_api_token(user=user, name="n", scopes=[], actor="test")
    assert client.get(URL).status_code in (401, 403)
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {nothing}").status_code == 403
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {reader}").status_code == 200
    assert client.post(URL, HTTP_AUTHORIZATION=f"Bearer {reader}").status_code in (403, 405)


def test_the_admin_shows_attempts_read_only(admin_client, loop):
    make_pool()
    queue_jobs(1, at=loop.clock.now)
    loop.step()

    attempt = Attempt.objects.get()
    page = admin_client.get(f"/admin/capacity/attempt/{attempt.pk}/change/")
    assert page.status_code == 200 and attempt.event_id in page.content.decode()
    assert admin_client.get("/admin/capacity/attempt/add/").status_code == 403
