"""Issue 23 item 7, the API: /api/v1/machines (read by viewers; a quarantined machine
released by an admin, MACH-08) and /api/v1/providers (read by viewers, changed by admins
through fleet.provider_actions, each change audited)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from accounts.models import AuditLog
from capacity import machines
from fleet.models import MachineProvider
from fleet.states import MachineState as M
from tests.capacity.machine_cast import (
    T0,
    configure,
    machine_loop,  # noqa: F401  # the fixture
    planned,
    rent,
    the_fake,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("machine_loop")]


def client(user=None, token=None) -> APIClient:
    c = APIClient()
    if user is not None:
        c.force_login(user)
    if token is not None:
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


# -- machines -------------------------------------------------------------------------------


def test_the_machine_list_shows_state_provider_host_and_why(viewer):
    row = configure()
    ready = rent(row, M.READY)
    answer = client(viewer).get("/api/v1/machines")
    assert answer.status_code == 200
    (shown,) = answer.json()["results"]
    assert set(shown) == {
        "id", "name", "provider", "state", "pool_id", "host", "message", "created_at",
        "state_changed_at", "age_seconds",
    }  # fmt: skip
    assert shown["name"] == ready.name and shown["state"] == "ready"
    assert shown["provider"] == "fake" and shown["pool_id"] == ready.pool_id
    assert shown["host"] == {"id": ready.host_id, "name": ready.name}
    assert shown["message"] == f"its agent joined as host {ready.name}"
    assert shown["age_seconds"] > 0
    detail = client(viewer).get(f"/api/v1/machines/{ready.pk}")
    assert detail.status_code == 200
    assert {**detail.json(), "age_seconds": 0} == {**shown, "age_seconds": 0}
    assert client(viewer).get("/api/v1/machines/999999").status_code == 404


def test_a_machine_without_a_host_shows_null_and_its_age_counts_from_its_planning(viewer):
    machine = planned(at=T0 - timedelta(hours=1))
    (shown,) = client(viewer).get("/api/v1/machines").json()["results"]
    assert shown["id"] == machine.pk and shown["host"] is None and shown["state"] == "planned"
    assert shown["age_seconds"] >= 3600


def test_the_machine_list_filters_by_state_and_provider_and_pages(viewer):
    configure()
    quarantined = rent(MachineProvider.objects.get(name="fake"), M.QUARANTINED)
    others = [planned("other") for _ in range(3)]
    api = client(viewer)

    def names(query: str) -> list[str]:
        answer = api.get(f"/api/v1/machines{query}")
        assert answer.status_code == 200, answer.content
        return [m["name"] for m in answer.json()["results"]]

    assert names("?state=quarantined") == [quarantined.name]
    assert names("?provider=other") == [m.name for m in reversed(others)]  # newest first
    assert names("?provider=other&state=quarantined") == []
    bad = api.get("/api/v1/machines?state=sideways")
    assert bad.status_code == 400 and bad.json()["state"] == ["not a machine state"]
    first = api.get("/api/v1/machines?limit=2").json()
    assert len(first["results"]) == 2 and first["next"]
    rest = api.get(first["next"]).json()
    seen = [m["name"] for m in first["results"] + rest["results"]]
    assert sorted(seen) == sorted([quarantined.name, *(m.name for m in others)])


def test_the_machine_list_costs_the_same_queries_for_many_machines(
    viewer, django_assert_max_num_queries
):
    row = configure()
    rent(row, M.READY)
    api = client(viewer)
    api.get("/api/v1/machines")
    with django_assert_max_num_queries(10) as few:
        api.get("/api/v1/machines")
    for _ in range(8):
        planned()
    with django_assert_max_num_queries(len(few)):
        assert len(api.get("/api/v1/machines").json()["results"]) == 9


def test_mach08_an_admin_releases_a_quarantined_machine_and_the_audit_says_who(admin):
    row = configure()
    machine = rent(row, M.QUARANTINED)
    answer = client(admin).post(f"/api/v1/machines/{machine.pk}/release")
    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == "deleted"
    assert answer.json()["message"] == "released by an operator; its resource was left alone"
    machine.refresh_from_db()
    assert machine.state == M.DELETED
    assert the_fake(row).inspect(machine.name) is not None  # its resource left alone
    audit = AuditLog.objects.get(action="machine.deleted", target_id=str(machine.pk))
    assert audit.actor == "user:ada" and audit.detail["from"] == "quarantined"


@pytest.mark.parametrize("until", [M.READY, M.PLANNED])
def test_mach08_only_a_quarantined_machine_is_released_anything_else_is_a_409(admin, until):
    machine = rent(configure(), until)
    answer = client(admin).post(f"/api/v1/machines/{machine.pk}/release")
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": f"machine {machine.name} is {until}: only a quarantined machine is released"
    }
    machine.refresh_from_db()
    assert machine.state == until
    assert client(admin).post("/api/v1/machines/999999/release").status_code == 404


def test_mach09_a_deleting_machine_is_never_released_into_deleted_without_its_inspect(admin):
    """machines.release alone would move deleting -> deleted (an allowed edge); the API
    refuses, so a machine is recorded deleted only once an inspect cannot find it."""
    row = configure()
    machine = rent(row, M.READY)
    assert machines.retire(machine, now=T0, actor="user:ada")
    answer = client(admin).post(f"/api/v1/machines/{machine.pk}/release")
    assert answer.status_code == 409
    machine.refresh_from_db()
    assert machine.state == M.DELETING


def test_an_operator_or_a_write_token_cannot_release(operator, token_for):
    machine = rent(configure(), M.QUARANTINED)
    for api in (client(operator), client(token=token_for["fleet:write"])):
        answer = api.post(f"/api/v1/machines/{machine.pk}/release")
        assert answer.status_code == 403 and "detail" in answer.json()
    assert client(token=token_for["fleet:read"]).get("/api/v1/machines").status_code == 200
    machine.refresh_from_db()
    assert machine.state == M.QUARANTINED
    assert (
        client(token=token_for["admin"])
        .post(f"/api/v1/machines/{machine.pk}/release")
        .json()["state"]
        == "deleted"
    )


# -- providers ------------------------------------------------------------------------------

LOCAL = {
    "name": "box-1", "kind": "local", "pools": ["zoomies-linux-x64"], "max_machines": 3,
    "max_per_pool": 2, "slots_per_machine": 1, "config": {"capacity": 1, "backend": "process"},
}  # fmt: skip


def test_an_admin_configures_a_provider_and_the_audit_row_is_written_with_it(admin, viewer):
    answer = client(admin).post("/api/v1/providers", LOCAL, format="json")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert {k: body[k] for k in LOCAL} == LOCAL
    assert body["enabled"] is True and body["down_since"] is None and body["last_error"] == ""
    row = MachineProvider.objects.get(name="box-1")
    assert (row.kind, row.max_machines, row.config) == ("local", 3, LOCAL["config"])
    audit = AuditLog.objects.get(action="provider.create")
    assert audit.actor == "user:ada" and audit.target_id == str(row.pk)
    assert audit.detail["config"] == ["backend", "capacity"]  # the keys, not the values

    listed = client(viewer).get("/api/v1/providers").json()["results"]
    assert [p["name"] for p in listed] == ["box-1"]
    assert client(viewer).get(f"/api/v1/providers/{row.pk}").json() == body


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kind": "proxmox"}, "config"),  # made from a setup, or a token_file (MACH-23)
        ({"kind": "cloud"}, "kind"),
        ({"name": "Box_1"}, "name"),
        ({"name": "-box"}, "name"),
        ({"name": "b" * 64}, "name"),
        ({"pools": ["zoomies-linux-x64", ""]}, "pools"),
        ({"pools": ["  "]}, "pools"),
        ({"pools": "zoomies-linux-x64"}, "pools"),
        ({"pools": [3]}, "pools"),
        ({"pools": ["a", "a"]}, "pools"),
        ({"max_machines": 0}, "max_machines"),
        ({"max_per_pool": -1}, "max_per_pool"),
        ({"slots_per_machine": 0}, "slots_per_machine"),
        ({"max_machines": 10**12}, "max_machines"),
        ({"config": {"python": "/bin/sh"}}, "config"),
        ({"config": {"backend": "lxc"}}, "config"),
        ({"config": {"capacity": 0}}, "config"),
        ({"config": []}, "config"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_a_bad_provider_is_a_400_naming_the_field_and_nothing_is_made(admin, change, field):
    answer = client(admin).post("/api/v1/providers", {**LOCAL, **change}, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json() and field in answer.json()["detail"]
    assert not MachineProvider.objects.exists()
    assert not AuditLog.objects.filter(action__startswith="provider.").exists()


def test_a_fake_provider_takes_no_settings_and_a_name_is_taken_once(admin):
    api = client(admin)
    fake = {"name": "fake", "kind": "fake", "pools": ["zoomies-linux-x64"]}
    refused = api.post("/api/v1/providers", {**fake, "config": {"x": 1}}, format="json")
    assert refused.status_code == 400 and "config" in refused.json()
    assert api.post("/api/v1/providers", fake, format="json").status_code == 201
    again = api.post("/api/v1/providers", fake, format="json")
    assert again.status_code == 400
    assert again.json()["name"] == ["a provider named fake exists already"]


def test_an_admin_changes_a_providers_limits_but_never_its_name_or_kind(admin):
    row = configure(max_machines=2)
    api = client(admin)
    answer = api.patch(
        f"/api/v1/providers/{row.pk}", {"max_machines": 5, "enabled": False}, format="json"
    )
    assert answer.status_code == 200, answer.content
    assert (answer.json()["max_machines"], answer.json()["enabled"]) == (5, False)
    row.refresh_from_db()
    assert (row.max_machines, row.enabled) == (5, False)
    audit = AuditLog.objects.get(action="provider.update")
    assert audit.detail == {
        "before": {"max_machines": 2, "enabled": True},
        "after": {"max_machines": 5, "enabled": False},
    }
    for change in ({"name": "renamed"}, {"kind": "local"}, {"limit": 3}, {"max_per_pool": 0}):
        refused = api.patch(f"/api/v1/providers/{row.pk}", change, format="json")
        assert refused.status_code == 400, (change, refused.content)
    # The GET shape sent back whole changes nothing and is no error.
    same = api.get(f"/api/v1/providers/{row.pk}").json()
    assert api.patch(f"/api/v1/providers/{row.pk}", same, format="json").status_code == 200
    assert api.put(f"/api/v1/providers/{row.pk}", same, format="json").status_code == 405
    row.refresh_from_db()
    assert (row.name, row.kind, row.max_machines) == ("fake", "fake", 5)


def test_a_provider_with_machines_left_is_not_deleted_one_without_is(admin):
    row = configure()
    machine = rent(row, M.QUARANTINED)
    api = client(admin)
    refused = api.delete(f"/api/v1/providers/{row.pk}")
    assert refused.status_code == 409
    assert refused.json() == {
        "detail": "provider fake has 1 machine(s) not yet deleted: disable it, and drain, "
        "retire or release them first"
    }
    assert api.post(f"/api/v1/machines/{machine.pk}/release").status_code == 200
    assert api.delete(f"/api/v1/providers/{row.pk}").status_code == 204
    assert not MachineProvider.objects.exists()
    audit = AuditLog.objects.get(action="provider.delete")
    assert audit.detail == {"name": "fake"} and audit.target_id == str(row.pk)


def test_operators_and_write_tokens_read_providers_but_change_none(operator, token_for):
    row = configure()
    for api in (client(operator), client(token=token_for["fleet:write"])):
        assert api.get("/api/v1/providers").status_code == 200
        assert api.post("/api/v1/providers", LOCAL, format="json").status_code == 403
        assert api.patch(f"/api/v1/providers/{row.pk}", {"max_machines": 9},
                         format="json").status_code == 403  # fmt: skip
        assert api.delete(f"/api/v1/providers/{row.pk}").status_code == 403
    row.refresh_from_db()
    assert row.max_machines == 2 and MachineProvider.objects.count() == 1


def test_a_proxmox_provider_is_listed_without_its_token_and_its_settings_stay(viewer, admin):
    """A Proxmox row holds its endpoint and token (plain here, as an operator's older row
    may; sealed when onboarding made it): listed without the token, whichever, and its
    config is not changed here (onboarding's own: tests/fleet/providers/test_onboarding.py)."""
    row = MachineProvider.objects.create(
        name="pve", kind="proxmox", created_at=T0,
        config={"endpoint": "https://pve:8006", "token": "s3cret", "token_sealed": "v1:x"},
    )  # fmt: skip
    shown = client(viewer).get(f"/api/v1/providers/{row.pk}").json()
    assert shown["kind"] == "proxmox" and shown["config"] == {"endpoint": "https://pve:8006"}
    listed = client(viewer).get("/api/v1/providers").content.decode()
    assert "s3cret" not in listed and "v1:x" not in listed
    other = MachineProvider.objects.create(name="cloud", kind="cloud", config={"k": "v"},
                                           created_at=T0)  # fmt: skip
    assert client(viewer).get(f"/api/v1/providers/{other.pk}").json()["config"] is None
    api = client(admin)
    path = f"/api/v1/providers/{row.pk}"
    assert api.patch(path, {"config": {}}, format="json").status_code == 400
    assert api.patch(path, {"max_per_pool": 1}, format="json").status_code == 200
    row.refresh_from_db()
    assert row.config["token"] == "s3cret" and row.max_per_pool == 1
