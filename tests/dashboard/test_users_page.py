"""The dashboard's Users page (issue 10 items 2, 3, 8): admins only; each change is an
accounts action with one audit row; the input is judged as /api/v1/users judges it."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import ApiToken, AuditLog, User
from tests.accounts.conftest import mint

pytestmark = pytest.mark.django_db
PASSWORD = "a long enough password"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def said(client: Client) -> str:
    return client.get("/users").content.decode()


def test_auth03_only_an_admin_opens_the_users_page_or_changes_anything_on_it(cast):
    """AUTH-03: the page and each of its changes check the caller's role."""
    victim = cast["viewer"]
    token = ApiToken.objects.get(prefix=mint(victim, ["fleet:read"])[:12])
    for role in ("operator", "viewer"):
        client = signed_in(cast[role])
        assert client.get("/users").status_code == 403
        assert 'href="/users"' not in client.get("/").content.decode()
        for path, form in (
            ("/users/new", {"username": "eve", "role": "admin"}),
            (f"/users/{victim.pk}/role", {"role": "admin"}),
            (f"/users/{victim.pk}/deactivate", {}),
            (f"/tokens/{token.pk}/revoke", {}),
        ):
            assert client.post(path, form).status_code == 403
    assert Client().get("/users").status_code == 302  # to sign in
    victim.refresh_from_db()
    token.refresh_from_db()
    assert (victim.role, victim.is_active, token.revoked_at) == ("viewer", True, None)
    assert not User.objects.filter(username="eve").exists()
    assert 'href="/users"' in signed_in(cast["admin"]).get("/").content.decode()


def test_auth06_an_admin_creates_a_local_user_with_a_role_and_one_audit_row(cast):
    admin = signed_in(cast["admin"])
    answer = admin.post(
        "/users/new", {"username": "nina", "role": "operator", "password": PASSWORD}
    )
    assert answer.status_code == 302
    nina = User.objects.get(username="nina")
    assert nina.role == "operator" and nina.check_password(PASSWORD)
    assert nina.password.startswith("argon2")
    assert [r.actor for r in AuditLog.objects.filter(action="user.create", target_id=nina.pk)] == [
        "user:ada"
    ]
    page = said(admin)
    assert "nina created as operator." in page and 'data-name="nina"' in page


def test_a_refused_user_is_said_why_in_the_apis_words_and_nothing_is_written(cast):
    admin = signed_in(cast["admin"])
    admin.post("/users/new", {"username": "bad name!", "role": "viewer"})
    assert "The user was not created: username:" in said(admin)
    admin.post("/users/new", {"username": "ada", "role": "viewer"})
    assert "a user called &#x27;ada&#x27; already exists" in said(admin)
    admin.post("/users/new", {"username": "short", "role": "viewer", "password": "x"})
    assert "password:" in said(admin)
    assert not AuditLog.objects.filter(action="user.create", actor="user:ada").exists()


def test_auth06_an_admin_changes_a_role_and_deactivates_a_user_each_audited(cast):
    admin, vera = signed_in(cast["admin"]), cast["viewer"]
    admin.post(f"/users/{vera.pk}/role", {"role": "operator"})
    vera.refresh_from_db()
    assert vera.role == "operator"
    change = AuditLog.objects.get(action="user.update", target_id=vera.pk)
    assert change.detail == {"before": {"role": "viewer"}, "after": {"role": "operator"}}
    admin.post(f"/users/{vera.pk}/deactivate")
    vera.refresh_from_db()
    assert not vera.is_active
    assert AuditLog.objects.filter(action="user.deactivate", target_id=vera.pk).count() == 1
    assert "vera is deactivated." in said(admin)


def test_the_last_active_admin_stays_an_admin(cast):
    admin, ada = signed_in(cast["admin"]), cast["admin"]
    admin.post(f"/users/{ada.pk}/role", {"role": "viewer"})
    admin.post(f"/users/{ada.pk}/deactivate")
    ada.refresh_from_db()
    assert (ada.role, ada.is_active) == ("admin", True)
    assert "ada is the last active admin" in said(admin)


def test_auth06_an_admin_sees_every_token_and_revokes_one_the_row_kept(cast):
    secret = mint(cast["operator"], ["fleet:write"], name="ci")
    token = ApiToken.objects.get(prefix=secret[:12])
    admin = signed_in(cast["admin"])
    page = said(admin)
    assert f"<code>{token.prefix}…</code>" in page and secret not in page
    admin.post(f"/tokens/{token.pk}/revoke")
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == "user:ada"
    assert AuditLog.objects.filter(action="api_token.revoke", target_id=token.pk).count() == 1
    answer = Client().get("/api/v1/pools", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert answer.status_code == 401
