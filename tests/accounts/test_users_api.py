"""/api/v1/users (issue 10 item 6): an admin lists users, creates a local one with a role,
changes a role and deactivates (a state, not a delete); each change is audited (AUTH-06)."""

from __future__ import annotations

import pytest

from accounts.models import AuditLog, User
from tests.accounts.conftest import client_for, make_user, mint

pytestmark = pytest.mark.django_db
PASSWORD = "a long enough passphrase 7"


def test_auth03_an_admin_creates_changes_and_deactivates_a_user_and_it_is_audited():
    ada = make_user("ada", "admin")
    admin = client_for(ada)
    made = admin.post(
        "/api/v1/users", {"username": "otto", "role": "viewer", "password": PASSWORD}, format="json"
    )
    assert made.status_code == 201, made.content
    otto = User.objects.get(username="otto")
    assert made.json()["role"] == "viewer" and "password" not in made.json()
    assert otto.check_password(PASSWORD) and otto.password.startswith("argon2")
    assert client_for(otto).get("/api/v1/pools").status_code == 200

    changed = admin.patch(f"/api/v1/users/{otto.pk}", {"role": "operator"}, format="json")
    assert changed.status_code == 200 and changed.json()["role"] == "operator"
    listed = admin.get("/api/v1/users").json()["results"]
    assert [(u["username"], u["role"], u["is_active"]) for u in listed] == [
        ("ada", "admin", True),
        ("otto", "operator", True),
    ]

    secret = mint(User.objects.get(pk=otto.pk), ["fleet:read"])
    gone = admin.post(f"/api/v1/users/{otto.pk}/deactivate")
    assert gone.status_code == 200 and gone.json()["is_active"] is False
    assert User.objects.filter(username="otto", is_active=False).exists()  # kept, not deleted
    assert client_for(token=secret).get("/api/v1/pools").status_code in (401, 403)
    assert client_for(otto).get("/api/v1/pools").status_code in (401, 403)
    actions = list(
        AuditLog.objects.filter(target_type="user", target_id=str(otto.pk))
        .order_by("id")
        .values_list("action", "actor")
    )
    assert actions == [
        ("user.create", "user:ada"),
        ("user.update", "user:ada"),
        ("user.deactivate", "user:ada"),
    ]


def test_bad_input_and_the_last_admin_are_refused_with_4xx_and_nothing_changes():
    ada = make_user("ada", "admin")
    admin = client_for(ada)
    make_user("otto", "viewer")
    before = AuditLog.objects.count()
    for body in (
        {"username": "x", "role": "root"},
        {"username": "bad name", "role": "viewer"},
        {"username": "y", "role": "viewer", "password": "short"},
    ):
        assert admin.post("/api/v1/users", body, format="json").status_code == 400, body
    taken = admin.post("/api/v1/users", {"username": "otto", "role": "viewer"}, format="json")
    assert taken.status_code == 409
    demote = admin.patch(f"/api/v1/users/{ada.pk}", {"role": "viewer"}, format="json")
    assert demote.status_code == 409 and "last active admin" in demote.json()["detail"]
    assert admin.post(f"/api/v1/users/{ada.pk}/deactivate").status_code == 409
    assert admin.post("/api/v1/users/999999/deactivate").status_code == 404
    assert AuditLog.objects.count() == before
    assert User.objects.get(pk=ada.pk).role == "admin"


def test_auth03_only_an_admin_reads_or_changes_users():
    otto = make_user("otto", "operator")
    assert client_for(otto).get("/api/v1/users").status_code == 403
    body = {"username": "z", "role": "admin"}
    assert client_for(otto).post("/api/v1/users", body, format="json").status_code == 403
    assert not User.objects.filter(username="z").exists()
