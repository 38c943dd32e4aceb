"""The controller's half of image prewarming (AGENT-14): which hosts are asked, with what,
over the agent protocol; the agent's half is tests/fleet/agent/test_admission.py and
tests/fleet/backends/test_prewarm.py."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from accounts.tokens import create_api_token
from fleet import protocol
from fleet.models import AgentTask, Host
from fleet.states import HostHealth
from runners.models import Pool
from tests.fleet.conftest import join

pytestmark = pytest.mark.usefixtures("registry_defaults")


@pytest.fixture
def api(db) -> APIClient:
    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _row, secret = create_api_token(user=user, name="w", scopes=["fleet:write"], actor="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.mark.django_db(transaction=True)
def test_agent14_a_pools_prewarm_goes_to_each_host_that_could_run_it_once(api, agent_api):
    """AGENT-14: every healthy, uncordoned host offering the pool's backend and platform is
    sent one image_prewarm naming the image its runners would run (a Docker pool's variant,
    BACK-16) and that the pool provides Docker; a host with one still open is not asked
    again; the agent takes it like any task and its answer closes it."""
    docker = {"backends": ["docker"], "platform": "linux/x64"}
    ready, token = join("ready", **docker)
    join("cordoned", **docker)
    join("unhealthy", **docker)
    join("process-only", backends=["process"], platform="linux/x64")
    join("arm", backends=["docker"], platform="linux/arm64")
    Host.objects.filter(name="cordoned").update(cordoned=True)
    Host.objects.filter(name="unhealthy").update(health=HostHealth.UNHEALTHY)
    pool = Pool.objects.create(
        name="zoomies-dind", backend="docker", platform="linux/x64", dind=True, labels=["x"]
    )

    answer = api.post(f"/api/v1/pools/{pool.pk}/prewarm")
    assert answer.status_code == 202, answer.content
    image = "ghcr.io/zoomies/runner:latest-docker"
    assert answer.json() == {"image": image, "hosts": ["ready"]}
    (task,) = AgentTask.objects.filter(kind="image_prewarm")
    assert (task.host_id, task.runner_id, task.lease_seconds) == (ready.pk, None, 20 * 60)

    assert api.post(f"/api/v1/pools/{pool.pk}/prewarm").json()["hosts"] == []
    (served,) = agent_api.get("tasks?wait=0", token=token).json()["tasks"]
    wanted = protocol.ImagePrewarmPayload.from_json(protocol.Task.from_json(served).payload)
    assert wanted == protocol.ImagePrewarmPayload("docker", image, "zoomies-dind", True)
    result = {"ok": True, "attempt": served["attempt"]}
    assert agent_api.post(f"tasks/{task.pk}/result", result, token=token).status_code == 200
    task.refresh_from_db()
    assert task.state == "done"
    # Closed, so a new prewarm asks the host again.
    assert api.post(f"/api/v1/pools/{pool.pk}/prewarm").json()["hosts"] == ["ready"]


@pytest.mark.django_db
def test_agent14_a_process_pool_has_no_image_to_prewarm(api):
    pool = Pool.objects.create(name="zoomies-proc", backend="process", labels=["x"])
    answer = api.post(f"/api/v1/pools/{pool.pk}/prewarm")
    assert answer.status_code == 409
    assert "no image" in answer.json()["detail"]
    assert not AgentTask.objects.exists()
