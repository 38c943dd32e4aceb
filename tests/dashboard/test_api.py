"""The REST API's lifecycle routes, its pages and its one error shape (issue 10 item 6).

Every verb calls the app's action (the audit tests in tests/accounts count one row per
route); here: what each answers, what it refuses, and what a list costs in queries.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.models import Host
from runners.actions import pools as pool_actions
from runners.models import Installation, Job, Pool, Runner
from tests.accounts.conftest import client_for
from zoomies_site.core import registry

pytestmark = pytest.mark.django_db
NOW = datetime.now(UTC)


@pytest.fixture
def ops(cast):
    return client_for(cast["operator"])


def make_pool(name="zoomies-a", **fields) -> Pool:
    values = {"name": name, "labels": ["linux"], "backend": "process", **fields}
    return pool_actions.create_pool(values, actor="test", now=NOW)


def make_runner(pool, state="idle", host=None, n=0) -> Runner:
    return Runner.objects.create(
        name=f"{pool.name}-{n}-x", pool=pool, host=host, state=state, created_at=NOW,
        state_changed_at=NOW,
    )  # fmt: skip


def test_a_pool_is_changed_with_the_admins_validation_and_refused_in_one_shape(ops):
    pool = make_pool()
    changed = ops.patch(f"/api/v1/pools/{pool.pk}", {"max_runners": 3}, format="json")
    assert changed.status_code == 200 and changed.json()["max_runners"] == 3
    refused = ops.patch(f"/api/v1/pools/{pool.pk}", {"name": "Bad Name"}, format="json")
    assert refused.status_code == 400
    body = refused.json()
    assert body["detail"].startswith("invalid input") and "name" in body
    assert Pool.objects.get(pk=pool.pk).name == "zoomies-a"  # nothing lost


def test_pause_and_resume_are_verbs_and_paused_is_no_field_to_write(ops):
    pool = make_pool()
    assert ops.post(f"/api/v1/pools/{pool.pk}/pause").json()["paused"] is True
    assert ops.post(f"/api/v1/pools/{pool.pk}/pause").json()["paused"] is True  # a no-op
    ops.patch(f"/api/v1/pools/{pool.pk}", {"paused": False}, format="json")
    assert Pool.objects.get(pk=pool.pk).paused is True
    assert ops.post(f"/api/v1/pools/{pool.pk}/resume").json()["paused"] is False


def test_a_pool_with_live_runners_is_not_deleted(ops):
    pool = make_pool()
    runner = make_runner(pool, "busy")
    refused = ops.delete(f"/api/v1/pools/{pool.pk}")
    assert refused.status_code == 409 and "live runner" in refused.json()["detail"]
    Runner.objects.filter(pk=runner.pk).update(state="removed")
    assert ops.delete(f"/api/v1/pools/{pool.pk}").status_code == 204
    assert not Pool.objects.exists() and not Runner.objects.exists()


def test_run11_a_runner_is_drained_and_a_finished_one_is_a_409(ops):
    pool = make_pool()
    host = Host.objects.create(name="zoomies-h", capacity=2)
    busy = make_runner(pool, "busy", host)
    answer = ops.post(f"/api/v1/runners/{busy.pk}/drain?confirm=true")
    assert answer.status_code == 200 and answer.json()["state"] == "draining"
    grace = registry.get("runners.drain_grace").total_seconds()
    assert busy.tasks.get().payload["grace"] == int(grace)  # a busy runner keeps the grace
    gone = make_runner(pool, "removed", n=1)
    refused = ops.post(f"/api/v1/runners/{gone.pk}/drain")
    assert refused.status_code == 409 and "removed" in refused.json()["detail"]


def test_a_host_is_cordoned_uncordoned_and_drained(ops):
    pool = make_pool()
    host = Host.objects.create(name="zoomies-h", capacity=2)
    idle = make_runner(pool, "idle", host)
    assert ops.post(f"/api/v1/hosts/{host.pk}/cordon").json()["host"]["cordoned"] is True
    assert ops.post(f"/api/v1/hosts/{host.pk}/uncordon").json()["host"]["cordoned"] is False
    drained = ops.post(f"/api/v1/hosts/{host.pk}/drain").json()
    assert drained["host"]["cordoned"] is True and drained["drained"] == [idle.name]
    assert Runner.objects.get(pk=idle.pk).state == "draining"


def test_a_join_token_is_shown_once_and_listed_by_its_prefix(ops):
    minted = ops.post("/api/v1/join-tokens", {"ttl_minutes": 10}, format="json").json()
    listed = ops.get("/api/v1/join-tokens").json()["results"]
    assert minted["secret"].startswith(minted["prefix"])
    assert listed[0]["prefix"] == minted["prefix"] and "secret" not in listed[0]


def test_installations_are_added_listed_and_removed_by_an_admin_only(cast, ops):
    admin = client_for(cast["admin"])
    body = {"github_id": 9, "account": "acme", "repositories": ["acme/app"]}
    assert ops.post("/api/v1/installations", body, format="json").status_code == 403
    added = admin.post("/api/v1/installations", body, format="json")
    assert added.status_code == 201 and added.json()["active"] is True
    bad = admin.post("/api/v1/installations", {**body, "repositories": ["nope"]}, format="json")
    assert bad.status_code == 400 and "repositories" in bad.json()
    pk = added.json()["id"]
    assert admin.delete(f"/api/v1/installations/{pk}").status_code == 204
    assert Installation.objects.get(pk=pk).active is False  # kept, as a state
    assert [i["github_id"] for i in ops.get("/api/v1/installations").json()["results"]] == [9]


def test_conf01_conf03_settings_show_help_value_and_source_and_refuse_with_findings(cast, ops):
    admin = client_for(cast["admin"])
    listed = {s["key"]: s for s in ops.get("/api/v1/settings?limit=1000").json()["results"]}
    grace = listed["runners.drain_grace"]
    assert grace["help"] and grace["source"] == "default" and grace["value"] == "5m"
    assert (
        ops.put("/api/v1/settings/runners.drain_grace", {"value": "1m"}, format="json").status_code
        == 403
    )
    saved = admin.put("/api/v1/settings/runners.drain_grace", {"value": "1m"}, format="json")
    assert saved.json()["value"] == "1m" and saved.json()["source"] == "database"
    refused = admin.put("/api/v1/settings/runners.job_wait_warning", {"value": "5s"}, format="json")
    assert refused.status_code == 400 and "runners.job_wait_warning" in refused.json()["detail"]
    reset = admin.delete("/api/v1/settings/runners.drain_grace")
    assert reset.json()["source"] == "default"
    assert ops.get("/api/v1/settings/no.such.key").status_code == 404


def test_every_list_is_paged(cast, ops):
    pool = make_pool()
    for n in range(5):
        make_runner(pool, n=n)
    first = ops.get("/api/v1/runners?limit=2").json()
    assert len(first["results"]) == 2 and first["next"]
    second = ops.get(first["next"]).json()
    assert len(second["results"]) == 2
    assert {r["id"] for r in first["results"]}.isdisjoint(r["id"] for r in second["results"])
    routes = ["pools", "jobs", "hosts", "installations", "join-tokens", "audit", "tokens",
              "settings", "problems"]  # fmt: skip
    for route in routes:
        assert set(ops.get(f"/api/v1/{route}").json()) >= {"next", "previous", "results"}, route
        assert len(ops.get(f"/api/v1/{route}?limit=1").json()["results"]) <= 1, route
    admin = client_for(cast["admin"])
    backups = admin.get("/api/v1/backups").json()  # admins only
    assert backups == {"next": None, "previous": None, "results": []}
    # ?limit= is every list's page size, the admin-only lists' too
    users = admin.get("/api/v1/users?limit=1").json()
    assert len(users["results"]) == 1 and users["next"]


def test_a_list_worked_out_per_request_pages_forwards_and_back_in_its_own_order(ops):
    keys = [row["key"] for row in registry.describe()]
    seen, url, pages = [], "/api/v1/settings?limit=7", []
    while url:
        page = ops.get(url).json()
        assert len(page["results"]) <= 7
        seen += [row["key"] for row in page["results"]]
        pages.append(page)
        url = page["next"]
    assert seen == keys and len(pages) == -(-len(keys) // 7)
    assert pages[0]["previous"] is None
    back = ops.get(pages[1]["previous"]).json()
    assert back["results"] == pages[0]["results"]
    assert ops.get("/api/v1/settings?cursor=not-one").status_code == 404


@pytest.mark.parametrize("route", ["pools", "runners", "jobs", "hosts", "installations"])
def test_a_list_costs_the_same_queries_for_3_rows_as_for_30(
    ops, route, django_assert_max_num_queries
):
    installation = Installation.objects.create(github_id=1, account="acme")

    def grow(count):
        for _ in range(count):
            n = Pool.objects.count() + 1
            pool = Pool.objects.create(name=f"zoomies-p{n}", backend="process")
            host = Host.objects.create(name=f"zoomies-h{n}", capacity=2)
            make_runner(pool, "idle", host)
            Job.objects.create(
                github_id=1000 + n, repository="acme/app", labels=["x"], status="queued",
                created_at=NOW - timedelta(minutes=1), updated_at=NOW, installation=installation,
            )  # fmt: skip
            Installation.objects.create(github_id=2000 + n, account="acme")

    grow(3)
    # Session, user and the page's one query (the host list counts runners in it).
    with django_assert_max_num_queries(6):
        assert ops.get(f"/api/v1/{route}").status_code == 200
    grow(27)
    with django_assert_max_num_queries(6):
        assert len(ops.get(f"/api/v1/{route}").json()["results"]) >= 30


def test_the_overview_counts_what_the_rows_say(ops):
    pool = make_pool()
    make_runner(pool, "busy")
    Job.objects.create(
        github_id=1, repository="acme/app", labels=["x"], status="queued", created_at=NOW,
        updated_at=NOW,
    )  # fmt: skip
    overview = ops.get("/api/v1/overview").json()
    assert overview["queued_jobs"] == 1 and overview["runners_by_state"]["busy"] == 1
    assert len(overview["queue_time"]["points"]) == 12


def test_run12_draining_a_busy_runner_needs_the_operators_confirmation(ops):
    pool = make_pool()
    host = Host.objects.create(name="zoomies-h", capacity=2)
    busy = make_runner(pool, "busy", host)
    refused = ops.post(f"/api/v1/runners/{busy.pk}/drain")
    assert refused.status_code == 409 and "confirm=true" in refused.json()["detail"]
    busy.refresh_from_db()
    assert busy.state == "busy" and not busy.tasks.exists()
    idle = make_runner(pool, "idle", host, n=1)
    assert ops.post(f"/api/v1/runners/{idle.pk}/drain").status_code == 200  # no job: no ask
    assert ops.post(f"/api/v1/runners/{busy.pk}/drain?confirm=true").json()["state"] == "draining"


def test_run13_pausing_or_deleting_a_pool_or_draining_a_host_drains_its_starting_runners(ops):
    pool = make_pool()
    host = Host.objects.create(name="zoomies-h", capacity=8)
    starting = [
        make_runner(pool, s, host, n=i) for i, s in enumerate(("provisioning", "registering"))
    ]
    busy = make_runner(pool, "busy", host, n=5)
    assert ops.post(f"/api/v1/pools/{pool.pk}/pause").status_code == 200
    states = dict(Runner.objects.values_list("name", "state"))
    assert [states[r.name] for r in starting] == ["draining", "draining"]
    assert states[busy.name] == "busy"  # a live one finishes its job
    other = make_pool("zoomies-other")
    late = make_runner(other, "provisioning", host, n=7)
    refused = ops.delete(f"/api/v1/pools/{other.pk}")
    assert (
        refused.status_code == 409 and "1 still starting were drained" in refused.json()["detail"]
    )
    assert Runner.objects.get(pk=late.pk).state == "draining"
    third = make_pool("zoomies-third")
    on_host = make_runner(third, "registering", host, n=9)
    ops.post(f"/api/v1/hosts/{host.pk}/drain")
    assert Runner.objects.get(pk=on_host.pk).state == "draining"
