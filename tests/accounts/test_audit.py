"""AUTH-06: every mutating API route leaves exactly one audit row naming who made the change
(the token by name, not only its owner); GET /api/v1/audit reads them, filtered and paged."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts import audit
from accounts.models import ApiToken, AuditLog
from fleet import provider_actions, provider_setups
from fleet.models import Host, Machine, MachineProvider
from fleet.states import MachineState
from runners.models import Installation, Pool, Runner
from tests.accounts.conftest import client_for, make_user, mint
from tests.accounts.test_route_walk import ROUTES
from tests.fleet.providers import pve
from zoomies_site.actions import set_setting
from zoomies_site.backup import service

pytestmark = pytest.mark.django_db


# Each recipe sets up what its call needs and returns the call.
def _pool():
    body = {"name": "zoomies-a", "labels": ["linux"], "backend": "process"}
    return lambda client: client.post("/api/v1/pools", body, format="json")


def _token():
    body = {"name": "ci", "scopes": ["fleet:read"]}
    return lambda client: client.post("/api/v1/tokens", body, format="json")


def _revoke():
    mint(make_user("someone", "viewer"), ["fleet:read"], name="victim")
    victim = ApiToken.objects.get(name="victim")
    return lambda client: client.post(f"/api/v1/tokens/{victim.pk}/revoke")


def _made_pool(**fields):

    return Pool.objects.create(name="zoomies-p", backend="process", **fields)


def _pool_edit(method):
    def recipe():
        pool = _made_pool()
        body = {"name": "zoomies-p", "labels": ["gpu"], "backend": "process"}
        return lambda client: getattr(client, method)(
            f"/api/v1/pools/{pool.pk}", body, format="json"
        )

    return recipe


def _pool_delete():
    pool = _made_pool()
    return lambda client: client.delete(f"/api/v1/pools/{pool.pk}")


def _pool_verb(verb, paused):
    def recipe():
        pool = _made_pool(paused=paused)
        return lambda client: client.post(f"/api/v1/pools/{pool.pk}/{verb}")

    return recipe


def _pool_prewarm():
    pool = Pool.objects.create(name="zoomies-p", backend="docker")
    return lambda client: client.post(f"/api/v1/pools/{pool.pk}/prewarm")


def _runner_drain():

    pool, now = _made_pool(), timezone.now()
    runner = Runner.objects.create(
        name="zoomies-p-1-a", pool=pool, state="idle", created_at=now, state_changed_at=now
    )
    return lambda client: client.post(f"/api/v1/runners/{runner.pk}/drain")


def _host_verb(verb, cordoned=False):
    def recipe():

        host = Host.objects.create(name="zoomies-h", capacity=2, cordoned=cordoned)
        return lambda client: client.post(f"/api/v1/hosts/{host.pk}/{verb}")

    return recipe


def _join_token():
    return lambda client: client.post("/api/v1/join-tokens", {"ttl_minutes": 30}, format="json")


def _installation_add():
    body = {"github_id": 42, "account": "acme", "kind": "org", "repositories": ["acme/app"]}
    return lambda client: client.post("/api/v1/installations", body, format="json")


def _installation_remove():

    row = Installation.objects.create(github_id=43, account="acme")
    return lambda client: client.delete(f"/api/v1/installations/{row.pk}")


def _setting_set():
    body = {"value": "2m"}
    return lambda client: client.put("/api/v1/settings/runners.drain_grace", body, format="json")


def _setting_reset():

    set_setting("runners.drain_grace", "3m", actor="test")
    return lambda client: client.delete("/api/v1/settings/runners.drain_grace")


def _backup_request():
    return lambda client: client.post("/api/v1/backups", {}, format="json")


def _backup_verify():

    service.backup_dir().mkdir(parents=True, exist_ok=True)
    taken = service.take(actor="test")
    return lambda client: client.post(f"/api/v1/backups/{taken.path.name}/verify")


def _user_create():
    body = {"username": "newbie", "role": "operator", "password": "a long enough passphrase 7"}
    return lambda client: client.post("/api/v1/users", body, format="json")


def _user_change():
    user = make_user("otto", "viewer")
    return lambda client: client.patch(
        f"/api/v1/users/{user.pk}", {"role": "operator"}, format="json"
    )


def _user_deactivate():
    user = make_user("otto", "viewer")
    return lambda client: client.post(f"/api/v1/users/{user.pk}/deactivate")


_LOCAL_PROVIDER = {
    "name": "box-1", "kind": "local", "pools": ["zoomies-linux-x64"], "max_machines": 3,
    "max_per_pool": 2, "slots_per_machine": 1, "config": {"capacity": 1, "backend": "process"},
}  # fmt: skip


def _provider_create():
    return lambda client: client.post("/api/v1/providers", _LOCAL_PROVIDER, format="json")


def _a_provider() -> MachineProvider:
    return provider_actions.create_provider(dict(_LOCAL_PROVIDER), actor="test", now=timezone.now())


def _provider_edit():
    row = _a_provider()
    return lambda client: client.patch(
        f"/api/v1/providers/{row.pk}", {"max_machines": 5}, format="json"
    )


def _provider_test():
    row = _a_provider()
    return lambda client: client.post(f"/api/v1/providers/{row.pk}/test")


def _provider_delete():
    row = _a_provider()
    return lambda client: client.delete(f"/api/v1/providers/{row.pk}")


def _machine_release():
    now = timezone.now()
    row = Machine.objects.create(
        name="zoomies-m-1", provider="box-1", state=MachineState.QUARANTINED,
        created_at=now, state_changed_at=now,
    )  # fmt: skip
    return lambda client: client.post(f"/api/v1/machines/{row.pk}/release")


def _setup_start():
    return lambda client: client.post("/api/v1/provider-setups", {"name": "pve-a"}, format="json")


def _setup_discover():
    server = pve.serve()
    setup, capability = provider_setups.start_setup(name="pve-a", actor="test", now=timezone.now())
    body = {"endpoint": server.url, "ca_pem": server.certificates.ca_file.read_text(),
            "token_id": pve.TOKEN_ID, "secret": pve.SECRET}  # fmt: skip
    provider_setups.enroll_setup(capability, body, now=timezone.now())

    def call(client):
        try:
            return client.post(f"/api/v1/provider-setups/{setup.pk}/discover")
        finally:
            server.stop()

    return call


# One valid call per mutating route: a route the walk finds and this table lacks fails below.
RECIPES = {
    ("api-pools", "POST"): (_pool, "pool.create"),
    ("api-pool", "PUT"): (_pool_edit("put"), "pool.update"),
    ("api-pool", "PATCH"): (_pool_edit("patch"), "pool.update"),
    ("api-pool", "DELETE"): (_pool_delete, "pool.delete"),
    ("api-pool-pause", "POST"): (_pool_verb("pause", False), "pool.pause"),
    ("api-pool-resume", "POST"): (_pool_verb("resume", True), "pool.resume"),
    ("api-pool-prewarm", "POST"): (_pool_prewarm, "pool.prewarm"),
    ("api-runner-drain", "POST"): (_runner_drain, "runner.draining"),
    ("api-host-cordon", "POST"): (_host_verb("cordon"), "host.cordon"),
    ("api-host-uncordon", "POST"): (_host_verb("uncordon", cordoned=True), "host.uncordon"),
    ("api-host-drain", "POST"): (_host_verb("drain"), "host.drain"),
    ("api-host-check", "POST"): (_host_verb("check"), "host.check"),
    ("api-join-tokens", "POST"): (_join_token, "join_token.create"),
    ("api-installations", "POST"): (_installation_add, "installation.create"),
    ("api-installation", "DELETE"): (_installation_remove, "installation.remove"),
    ("api-setting", "PUT"): (_setting_set, "setting.set"),
    ("api-setting", "DELETE"): (_setting_reset, "setting.reset"),
    ("api-tokens", "POST"): (_token, "api_token.create"),
    ("api-token-revoke", "POST"): (_revoke, "api_token.revoke"),
    ("api-users", "POST"): (_user_create, "user.create"),
    ("api-user", "PATCH"): (_user_change, "user.update"),
    ("api-user-deactivate", "POST"): (_user_deactivate, "user.deactivate"),
    ("api-backups", "POST"): (_backup_request, "backup.requested"),
    ("api-backup-verify", "POST"): (_backup_verify, "backup.verify"),
    ("api-providers", "POST"): (_provider_create, "provider.create"),
    ("api-provider", "PATCH"): (_provider_edit, "provider.update"),
    ("api-provider", "DELETE"): (_provider_delete, "provider.delete"),
    ("api-provider-test", "POST"): (_provider_test, "provider.test"),
    ("api-machine-release", "POST"): (_machine_release, "machine.deleted"),
    ("api-provider-setups", "POST"): (_setup_start, "provider_setup.start"),
    ("api-provider-setup-discover", "POST"): (_setup_discover, "provider_setup.discover"),
}
MUTATING = sorted({(name, method) for name, _path, method in ROUTES if method != "GET"})


def test_auth06_every_mutating_route_has_a_recipe_here():
    assert set(MUTATING) == set(RECIPES)


@pytest.mark.parametrize("route", MUTATING, ids=[f"{m} {n}" for n, m in MUTATING])
@pytest.mark.parametrize("via", ["session", "token"])
def test_auth06_each_mutating_route_writes_exactly_one_row(route, via):
    ada = make_user("ada", "admin")
    secret = mint(ada, ["admin"], name="deploy")
    client = client_for(ada) if via == "session" else client_for(token=secret)
    recipe, action = RECIPES[route]
    call = recipe()
    before = AuditLog.objects.count()
    answer = call(client)
    assert answer.status_code in (200, 201, 202, 204), answer.content
    rows = list(AuditLog.objects.order_by("-id")[: AuditLog.objects.count() - before])
    assert [r.action for r in rows] == [action]
    if via == "session":
        assert rows[0].actor == "user:ada"
    else:
        prefix = ApiToken.objects.get(name="deploy").prefix
        assert rows[0].actor == f"token:{prefix}(deploy) of user:ada"


def test_auth06_a_refused_call_writes_nothing():
    vera = make_user("vera", "viewer")
    before = AuditLog.objects.count()
    otto = make_user("otto", "operator")
    before = AuditLog.objects.count()
    assert _pool()(client_for(vera)).status_code == 403
    assert _pool()(client_for(otto)).status_code == 201
    assert AuditLog.objects.count() == before + 1


def test_the_audit_api_filters_by_actor_object_and_time_and_pages():
    t0 = timezone.now() - timedelta(hours=2)
    for i in range(5):
        audit.record(
            actor="system:reconcile",
            action="runner.create",
            at=t0 + timedelta(minutes=i),
            detail={"i": i},
        )
    audit.record(actor="user:ada", action="pool.create", at=t0 + timedelta(hours=1))
    AuditLog.objects.filter(action="pool.create").update(target_type="pool", target_id="7")
    client = client_for(make_user("vera", "viewer"))

    everything = client.get("/api/v1/audit").json()["results"]
    assert len(everything) >= 6 and everything[0]["action"] in ("pool.create", "user.create")
    by_actor = client.get("/api/v1/audit", {"actor": "system:reconcile"}).json()["results"]
    assert [r["detail"]["i"] for r in by_actor] == [4, 3, 2, 1, 0]
    by_object = client.get("/api/v1/audit", {"target_type": "pool", "target_id": "7"}).json()
    assert [r["action"] for r in by_object["results"]] == ["pool.create"]
    window = client.get("/api/v1/audit", {
        "actor": "reconcile", "since": (t0 + timedelta(minutes=1)).isoformat(),
        "until": (t0 + timedelta(minutes=3)).isoformat(),
    }).json()["results"]  # fmt: skip
    assert [r["detail"]["i"] for r in window] == [2, 1]

    first = client.get("/api/v1/audit", {"actor": "reconcile", "limit": 2}).json()
    assert [r["detail"]["i"] for r in first["results"]] == [4, 3] and first["next"]
    second = client.get(first["next"]).json()
    assert [r["detail"]["i"] for r in second["results"]] == [2, 1]


def test_the_audit_api_refuses_a_bad_filter_with_a_400():
    client = client_for(make_user("vera", "viewer"))
    assert client.get("/api/v1/audit", {"since": "yesterday"}).status_code == 400
    assert client_for().get("/api/v1/audit").status_code == 401
