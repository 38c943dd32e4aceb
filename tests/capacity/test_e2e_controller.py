"""CAP-17, CAP-18 end to end: a real controller delivers through its django-q2 cluster, is
SIGKILLed between two tries, and the restarted controller makes the second try under the
same event id."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime

import pytest

from tests.capacity.receiver import ScriptedReceiver
from tests.e2e.harness import Controller, kill_leftovers, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SEED = """
from django.utils import timezone
from runners.models import Job, Pool
Pool.objects.create(name="zoomies-gpu", labels=["gpu"], backend="docker",
                    platform="linux/x64", host_selector={"gpu": "a100"})
now = timezone.now()
Job.objects.create(github_id=4242, repository="octo/app", labels=["self-hosted", "gpu"],
                   status="queued", created_at=now, updated_at=now)
"""


@pytest.mark.slow  # a kill drill (30 s): .ci/run's slow pass, after the test command
def test_cap17_cap18_a_controller_killed_between_tries_resumes_the_attempt(tmp_path):
    secret = secrets.token_hex(32)
    receiver = ScriptedReceiver(secret, str(tmp_path / "receiver.db"), lambda: datetime.now(UTC))
    receiver.script = [500]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    controller = Controller(
        data_dir,
        env={
            "ZOOMIES_CAPACITY_DEMAND_DESTINATION_URL": receiver.url,
            "ZOOMIES_CAPACITY_DEMAND_SIGNING_SECRET": secret,
            "ZOOMIES_CAPACITY_DEMAND_INTERVAL": "1s",
            "ZOOMIES_CAPACITY_DEMAND_RETRY_BACKOFF": "20s",
        },
    )
    try:
        controller.prepare()
        controller.manage("shell", "-c", SEED)
        controller.start("--no-agent")
        receiver.wait_for(1, timeout=60)
        first = receiver.arrivals[0]
        assert first.status == 500
        wait_for(
            lambda: controller.api("capacity/events")["attempts"][0]["state"] == "pending",
            30,
            "the refused try to be recorded",
        )
        controller.kill()  # inside the 20 s backoff: the sleeping delivery dies with it
        assert len(receiver.arrivals) == 1
        controller.start("--no-agent")
        receiver.wait_for(2, timeout=90)
        second = receiver.arrivals[1]
        assert second.status == 204
        assert second.event_id == first.event_id and second.body == first.body
        body = json.loads(second.body)
        assert body["missing"] == {
            "backend": "docker",
            "platform": "linux/x64",
            "host_selector": {"gpu": "a100"},
        }
        assert receiver.reference.targets() == {body["pool_id"]: 1}
        [attempt] = controller.api("capacity/events")["attempts"]
        assert attempt["state"] == "delivered"
        assert [t["outcome"] for t in attempt["tries"]] == ["refused", "accepted"]
    finally:
        controller.stop()
        receiver.stop()
        kill_leftovers(str(data_dir))
