"""The fleet in the Django admin: lists load, lifecycle fields are read-only, no hand-made
tasks or machines, and a cordon goes through the action (with its audit row).
"""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site

from accounts.models import AuditLog
from fleet.models import AgentTask, Host, JoinToken, Machine
from fleet.taskqueue import enqueue_task
from tests.fleet.conftest import join, make_runner

pytestmark = pytest.mark.usefixtures("registry_defaults")


@pytest.mark.django_db
def test_the_fleet_admin_lists_load_and_guard_lifecycle_fields(client, admin):
    host, _ = join("h1")
    runner = make_runner(host)
    AgentTask.objects.create(
        host=host,
        runner=runner,
        kind="create_runner",
        lease_seconds=1200,
        created_at=host.joined_at,
    )
    client.force_login(admin)
    for model in (Host, JoinToken, AgentTask, Machine):
        url = f"/admin/fleet/{model._meta.model_name}/"
        assert client.get(url).status_code == 200, url
    assert client.get(f"/admin/fleet/host/{host.pk}/change/").status_code == 200
    host_admin = site._registry[Host]
    for field in ("health", "cordoned", "agent_token_hash", "last_heartbeat_at"):
        assert field in host_admin.readonly_fields
    task_admin = site._registry[AgentTask]
    for field in ("state", "attempt", "lease_deadline"):
        assert field in task_admin.readonly_fields
    assert "state" in site._registry[Machine].readonly_fields
    assert "token_hash" in site._registry[JoinToken].readonly_fields
    request = type("R", (), {"user": admin})()
    assert not task_admin.has_add_permission(request)
    assert not site._registry[Machine].has_add_permission(request)


@pytest.mark.django_db
def test_cordoning_from_the_admin_goes_through_the_action(client, admin):
    host, _ = join("h1")
    client.force_login(admin)
    answer = client.post(
        "/admin/fleet/host/", {"action": "cordon", "_selected_action": [host.pk]}, follow=True
    )
    assert answer.status_code == 200
    host.refresh_from_db()
    assert host.cordoned
    assert AuditLog.objects.filter(action="host.cordon", actor="user:ada").exists()


@pytest.mark.django_db
def test_auth07_the_task_admin_shows_the_env_names_and_never_the_credential(client, admin):
    """AUTH-07: the admin shows which variables a task carries, not their (sealed) values."""

    host, _ = join("h1")
    runner = make_runner(host)
    task = enqueue_task(
        host_id=host.pk,
        runner_id=runner.pk,
        kind="create_runner",
        payload={"runner_id": runner.pk, "env": {"ACTIONS_RUNNER_INPUT_JITCONFIG": "jit-abc"}},
        now=host.joined_at,
    )
    client.force_login(admin)
    page = client.get(f"/admin/fleet/agenttask/{task.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "ACTIONS_RUNNER_INPUT_JITCONFIG" in body
    assert "jit-abc" not in body and "sealed:" not in body
