"""The Django admin: the Zoomies role decides (AUTH-03), and every change made there writes
exactly one audit row with before and after, in the save's transaction (AUTH-06)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import Client
from django.utils import timezone
from django_q.models import Failure, OrmQ, Schedule, Task

from accounts.admin_audit import AuditedAdmin
from accounts.models import ApiToken, AuditLog, User
from fleet.models import AgentTask, Host, JoinToken, Machine
from runners.models import Installation, Job, Pool, Runner, WebhookDelivery
from tests.accounts.conftest import make_user, mint
from zoomies_site.core.models import Lease

pytestmark = pytest.mark.django_db


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def form_data(response) -> dict:
    """What the admin's change form would post back unchanged."""
    form = response.context["adminform"].form
    data = {}
    for name in form.fields:
        value = form[name].value()
        if isinstance(value, bool):
            if value:
                data[name] = "on"
        elif value is not None:
            data[name] = value
    return data


def one_new_row(before: int) -> AuditLog:
    rows = AuditLog.objects.order_by("-id")[: AuditLog.objects.count() - before]
    assert len(rows) == 1, [str(r) for r in rows]
    return rows[0]


def test_auth06_every_registered_model_admin_is_audited():
    assert admin.site._registry
    for model, model_admin in admin.site._registry.items():
        assert isinstance(model_admin, AuditedAdmin), model


@pytest.fixture
def ada():
    return make_user("ada", "admin")


def test_auth06_pool_add_change_delete_each_write_one_row(ada):
    client = signed_in(ada)
    start = AuditLog.objects.count()
    added = client.post("/admin/runners/pool/add/", {
        "name": "zoomies-a", "labels": '["linux"]', "backend": "process", "host_selector": "{}",
        "ephemeral": "on", "warm": "0", "max_runners": "4", "runner_group_id": "1",
    })  # fmt: skip
    assert added.status_code == 302, added.context["adminform"].form.errors
    pool = Pool.objects.get(name="zoomies-a")
    row = one_new_row(start)
    assert (row.action, row.actor, row.target_id) == ("pool.admin_add", "user:ada", str(pool.pk))
    assert row.detail["after"]["name"] == "zoomies-a"

    page = client.get(f"/admin/runners/pool/{pool.pk}/change/")
    data = {**form_data(page), "max_runners": "7"}
    start = AuditLog.objects.count()
    assert client.post(f"/admin/runners/pool/{pool.pk}/change/", data).status_code == 302
    row = one_new_row(start)
    assert row.action == "pool.admin_change" and row.detail["changed"] == ["max_runners"]
    assert row.detail["before"]["max_runners"] == 4 and row.detail["after"]["max_runners"] == 7

    start = AuditLog.objects.count()
    client.post(f"/admin/runners/pool/{pool.pk}/delete/", {"post": "yes"})
    assert not Pool.objects.exists()
    row = one_new_row(start)
    assert row.action == "pool.admin_delete" and row.detail["before"]["name"] == "zoomies-a"


def test_auth06_installation_add_change_and_bulk_delete_each_write_one_row_per_object(ada):
    client = signed_in(ada)
    start = AuditLog.objects.count()
    added = client.post("/admin/runners/installation/add/", {
        "github_id": "42", "account": "acme", "kind": "org", "repositories": "[]", "active": "on",
    })  # fmt: skip
    assert added.status_code == 302, added.context["adminform"].form.errors
    inst = Installation.objects.get(github_id=42)
    assert one_new_row(start).action == "installation.admin_add"

    data = {
        **form_data(client.get(f"/admin/runners/installation/{inst.pk}/change/")),
        "account": "acme-renamed",
    }
    start = AuditLog.objects.count()
    client.post(f"/admin/runners/installation/{inst.pk}/change/", data)
    row = one_new_row(start)
    assert row.detail["before"]["account"] == "acme" and row.detail["after"]["account"] == (
        "acme-renamed"
    )

    start = AuditLog.objects.count()
    client.post("/admin/runners/installation/", {
        "action": "delete_selected", "_selected_action": [inst.pk], "post": "yes",
    })  # fmt: skip
    assert not Installation.objects.exists()
    assert one_new_row(start).action == "installation.admin_delete"


def test_auth06_user_edits_and_password_changes_are_audited_without_the_hash(ada):
    client = signed_in(ada)
    start = AuditLog.objects.count()
    added = client.post("/admin/accounts/user/add/", {
        "username": "bob", "role": "viewer", "usable_password": "true",
        "password1": "a fine long password", "password2": "a fine long password",
    })  # fmt: skip
    assert added.status_code == 302, added.context["adminform"].form.errors
    bob = User.objects.get(username="bob")
    row = one_new_row(start)
    assert row.action == "user.admin_add" and row.detail["after"]["password"] == "•••"

    data = {**form_data(client.get(f"/admin/accounts/user/{bob.pk}/change/")), "role": "operator"}
    start = AuditLog.objects.count()
    assert client.post(f"/admin/accounts/user/{bob.pk}/change/", data).status_code == 302
    row = one_new_row(start)
    assert row.detail["before"]["role"] == "viewer" and row.detail["after"]["role"] == "operator"

    start = AuditLog.objects.count()
    changed = client.post(f"/admin/accounts/user/{bob.pk}/password/", {
        "password1": "another long password", "password2": "another long password",
        "usable_password": "true",
    })  # fmt: skip
    assert changed.status_code == 302
    row = one_new_row(start)
    assert row.action == "user.admin_change" and row.detail["changed"] == ["password"]
    assert "argon2" not in str(row.detail)


def test_auth06_tokens_are_revoked_from_the_admin_never_deleted(ada):
    mint(ada, ["fleet:read"], name="ci")
    token = ApiToken.objects.get(name="ci")
    client = signed_in(ada)
    start = AuditLog.objects.count()
    client.post("/admin/accounts/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert one_new_row(start).action == "api_token.revoke"
    request = type("R", (), {"user": ada})()
    assert not admin.site._registry[ApiToken].has_delete_permission(request)


def test_auth06_host_edits_and_cordons_write_one_row_each(ada):
    host = Host.objects.create(name="zoomies-h", capacity=2, backends=["process"])
    client = signed_in(ada)
    data = {**form_data(client.get(f"/admin/fleet/host/{host.pk}/change/")), "name": "zoomies-h2"}
    start = AuditLog.objects.count()
    assert client.post(f"/admin/fleet/host/{host.pk}/change/", data).status_code == 302
    assert one_new_row(start).action == "host.admin_change"
    start = AuditLog.objects.count()
    client.post("/admin/fleet/host/", {"action": "cordon", "_selected_action": [host.pk]})
    assert one_new_row(start).action == "host.cordon"


def test_auth03_the_admin_asks_the_role_not_the_staff_flag():
    viewer = make_user("vera", "viewer")
    User.objects.filter(pk=viewer.pk).update(is_staff=True, is_superuser=True)
    viewer.refresh_from_db()
    pool = Pool.objects.create(name="zoomies-a", backend="process")
    client = signed_in(viewer)
    assert client.get("/admin/").status_code == 200
    page = client.get(f"/admin/runners/pool/{pool.pk}/change/")
    assert page.status_code == 200 and not page.context["has_change_permission"]
    client.post(f"/admin/runners/pool/{pool.pk}/delete/", {"post": "yes"})
    assert Pool.objects.filter(pk=pool.pk).exists()
    for secret in ("accounts/apitoken", "accounts/user", "zoomies_site/settingvalue"):
        assert client.get(f"/admin/{secret}/").status_code == 403, secret

    operator = make_user("otto", "operator")
    client = signed_in(operator)
    assert client.get(f"/admin/runners/pool/{pool.pk}/change/").context["has_change_permission"]
    inst = Installation.objects.create(github_id=1, account="acme")
    page = client.get(f"/admin/runners/installation/{inst.pk}/change/")
    assert not page.context["has_change_permission"]


def test_auth03_a_user_without_a_role_is_not_let_into_the_admin():
    nobody = make_user("nobody", "viewer")
    User.objects.filter(pk=nobody.pk).update(role="", is_staff=True, is_superuser=True)
    nobody.refresh_from_db()
    assert signed_in(nobody).get("/admin/").status_code == 302  # to the login page


def _rows():
    """One row of each model the admin may delete, built as plainly as its table allows."""

    now = timezone.now()
    host = Host.objects.create(name="zoomies-h", capacity=2, backends=["process"])
    pool = Pool.objects.create(name="zoomies-a", backend="process")
    task = dict(name="t", func="math.floor", started=now, stopped=now)
    return {
        Schedule: lambda: Schedule.objects.create(func="math.floor"),
        Task: None,
        OrmQ: lambda: OrmQ.objects.create(key="k", payload="p"),
        User: lambda: make_user("bob", "viewer"),
        Lease: lambda: Lease.objects.create(name="a-lease"),
        Installation: lambda: Installation.objects.create(github_id=9, account="acme"),
        Pool: lambda: Pool.objects.create(name="zoomies-b", backend="process"),
        Runner: lambda: Runner.objects.create(
            name="zoomies-a-1", pool=pool, created_at=now, state_changed_at=now
        ),
        Job: lambda: Job.objects.create(
            github_id=5, repository="acme/app", status="queued", created_at=now, updated_at=now
        ),
        WebhookDelivery: lambda: WebhookDelivery.objects.create(
            delivery_id="d1", event="ping", received_at=now
        ),
        Host: lambda: Host.objects.create(name="zoomies-g", capacity=1, backends=["process"]),
        JoinToken: lambda: JoinToken.objects.create(
            token_hash="0" * 64, prefix="zjt_x", created_at=now, expires_at=now
        ),
        AgentTask: lambda: AgentTask.objects.create(
            host=host, kind="stop_runner", lease_seconds=60, created_at=now
        ),
        Machine: lambda: Machine.objects.create(
            name="m1", provider="p", created_at=now, state_changed_at=now
        ),
        "success": lambda: Task.objects.create(id="s1", success=True, **task),
        "failure": lambda: Task.objects.create(id="f1", success=False, **task),
    }


def test_auth06_deleting_any_row_in_the_admin_writes_one_row(ada):
    """Each model the admin may delete from: one delete, one audit row with what was there."""
    factories = _rows()
    request = type("R", (), {"user": ada})()
    client = signed_in(ada)
    deletable = [
        (model, model_admin)
        for model, model_admin in admin.site._registry.items()
        if model_admin.has_delete_permission(request)
    ]
    assert len(deletable) >= 12
    for model, _model_admin in deletable:
        key = model
        if model._meta.proxy and model._meta.model_name in ("success", "failure"):
            key = model._meta.model_name
        assert key in factories, f"no row factory for {model._meta.label}"
        row = factories[key]()
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/{row.pk}/delete/"
        start = AuditLog.objects.count()
        answer = client.post(url, {"post": "yes"})
        assert answer.status_code == 302, (url, answer.status_code)
        assert not model._base_manager.filter(pk=row.pk).exists(), url
        audit_row = one_new_row(start)
        assert audit_row.action == f"{model._meta.model_name}.admin_delete", url
        assert audit_row.detail["before"] is not None


def test_auth06_another_packages_admin_action_writes_one_row(ada):

    now = timezone.now()
    Task.objects.create(id="f1", name="t", func="math.floor", started=now, stopped=now,
                        success=False)  # fmt: skip
    start = AuditLog.objects.count()
    signed_in(ada).post("/admin/django_q/failure/", {
        "action": "resubmit_task", "_selected_action": ["f1"],
    })  # fmt: skip
    assert OrmQ.objects.count() == 1  # the task was resubmitted
    row = one_new_row(start)
    assert row.action == "failure.admin_action" and row.detail["action"] == "resubmit_task"
    assert row.detail["ids"] == ["f1"] and Failure._meta.model_name == "failure"


def test_auth06_changing_ones_own_password_in_the_admin_writes_one_row():
    vera = make_user("vera", "viewer", password="the old long password")
    client = signed_in(vera)
    start = AuditLog.objects.count()
    answer = client.post("/admin/password_change/", {
        "old_password": "the old long password", "new_password1": "the new long password",
        "new_password2": "the new long password",
    })  # fmt: skip
    assert answer.status_code == 302
    row = one_new_row(start)
    assert (row.action, row.actor) == ("user.password_change", "user:vera")
    assert "argon2" not in str(row.detail)
