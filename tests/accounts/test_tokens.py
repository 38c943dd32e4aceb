"""API tokens: prefix shown, secret once, hashed; scopes, expiry, last use, revocation."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from accounts import actions
from accounts.models import ApiToken, AuditLog
from accounts.tokens import hash_secret, token_for_secret, touch
from tests.accounts.conftest import client_for, make_user, mint

pytestmark = pytest.mark.django_db


def test_auth05_the_secret_is_shown_once_and_only_its_hash_is_kept(cast):
    client = client_for(cast["operator"])
    answer = client.post("/api/v1/tokens", {"name": "ci", "scopes": ["fleet:write"]}, format="json")
    assert answer.status_code == 201, answer.content
    secret = answer.json()["secret"]
    row = ApiToken.objects.get(pk=answer.json()["id"])
    assert row.secret_hash == hash_secret(secret) and secret not in str(row.__dict__)
    assert secret.startswith(row.prefix) and answer.json()["prefix"] == row.prefix
    listed = client.get("/api/v1/tokens").json()["results"]
    assert [t["prefix"] for t in listed] == [row.prefix]
    assert "secret" not in listed[0] and "secret_hash" not in listed[0]


def test_auth04_users_see_their_own_tokens_and_admins_see_all(cast):
    mint(cast["viewer"], ["fleet:read"], name="mine")
    mint(cast["operator"], ["fleet:read"], name="theirs")
    viewer_sees = client_for(cast["viewer"]).get("/api/v1/tokens").json()["results"]
    admin_sees = client_for(cast["admin"]).get("/api/v1/tokens").json()["results"]
    assert [t["name"] for t in viewer_sees] == ["mine"]
    assert sorted(t["name"] for t in admin_sees) == ["mine", "theirs"]


def test_a_user_cannot_revoke_anothers_token_but_an_admin_can(cast):
    mint(cast["operator"], ["fleet:read"], name="theirs")
    token = ApiToken.objects.get(name="theirs")
    assert client_for(cast["viewer"]).post(f"/api/v1/tokens/{token.pk}/revoke").status_code == 404
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    assert client_for(cast["admin"]).post(f"/api/v1/tokens/{token.pk}/revoke").status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == "user:ada"


def test_a_revoked_token_is_refused_and_its_row_stays(cast):
    secret = mint(cast["operator"], ["fleet:read"])
    client = client_for(token=secret)
    assert client.get("/api/v1/pools").status_code == 200
    token = ApiToken.objects.get(secret_hash=hash_secret(secret))
    assert actions.revoke_api_token(token, actor="test") is True
    assert actions.revoke_api_token(token, actor="test") is False  # a state, set once
    answer = client.get("/api/v1/pools")
    assert answer.status_code == 401 and "revoked" in answer.json()["detail"]
    assert ApiToken.objects.filter(pk=token.pk).exists()


def test_an_expired_token_is_refused(cast):
    token, secret = actions.create_api_token(
        user=cast["operator"], name="short", scopes=["fleet:read"],
        expires_at=timezone.now() + timedelta(minutes=5), actor="test",
    )  # fmt: skip
    assert token_for_secret(secret) is not None
    assert token_for_secret(secret, now=timezone.now() + timedelta(minutes=6)) is None
    with pytest.raises(actions.AccountError, match="past"):
        actions.create_api_token(
            user=cast["operator"], name="x", scopes=["fleet:read"],
            expires_at=timezone.now() - timedelta(seconds=1), actor="test",
        )  # fmt: skip


def test_last_use_is_written_at_most_once_a_minute(cast):
    secret = mint(cast["operator"], ["fleet:read"])
    token = token_for_secret(secret)
    t0 = timezone.now()
    assert touch(token, now=t0) is True
    assert touch(token, now=t0 + timedelta(seconds=59)) is False
    assert touch(token, now=t0 + timedelta(seconds=61)) is True
    assert ApiToken.objects.get(pk=token.pk).last_used_at == t0 + timedelta(seconds=61)


def test_last_use_is_recorded_by_a_real_call(cast, django_assert_max_num_queries):
    secret = mint(cast["operator"], ["fleet:read"])
    client = client_for(token=secret)
    client.get("/api/v1/pools")
    assert ApiToken.objects.get(secret_hash=hash_secret(secret)).last_used_at is not None
    writes = []

    with connection.execute_wrapper(lambda ex, sql, *a: writes.append(sql) or ex(sql, *a)):
        client.get("/api/v1/pools")
    assert not [q for q in writes if q.lstrip().upper().startswith("UPDATE")]


def test_scopes_must_be_known_and_within_the_role(cast):
    with pytest.raises(actions.AccountError, match="unknown scope"):
        actions.create_api_token(user=cast["admin"], name="x", scopes=["root"], actor="t")
    with pytest.raises(actions.AccountError, match="never exceeds"):
        actions.create_api_token(user=cast["operator"], name="x", scopes=["admin"], actor="t")
    assert mint(cast["admin"], ["admin"])


def test_managing_tokens_with_a_token_takes_the_admin_scope(cast):
    writer = client_for(token=mint(cast["admin"], ["fleet:write"]))
    body = {"name": "next", "scopes": ["fleet:read"]}
    assert writer.post("/api/v1/tokens", body, format="json").status_code == 403
    admin = client_for(token=mint(cast["admin"], ["admin"]))
    made = admin.post("/api/v1/tokens", {**body, "user": "vera"}, format="json")
    assert made.status_code == 201 and made.json()["user"] == "vera"
    row = AuditLog.objects.get(action="api_token.create", target_id=str(made.json()["id"]))
    assert row.actor.startswith("token:zpt_") and row.actor.endswith("of user:ada")


def test_only_an_admin_mints_for_someone_else(cast):
    answer = client_for(cast["operator"]).post(
        "/api/v1/tokens", {"name": "x", "scopes": ["fleet:read"], "user": "vera"}, format="json"
    )
    assert answer.status_code == 403


def test_bad_bodies_are_400s(cast):
    client = client_for(cast["admin"])
    for body in (
        {},
        {"name": "x"},
        {"name": "x", "scopes": []},
        {"name": "x", "scopes": ["no"]},
        {"name": "x", "scopes": ["fleet:read"], "expires_at": "soon"},
        {"name": "x", "scopes": ["fleet:read"], "user": "nobody"},
    ):
        assert client.post("/api/v1/tokens", body, format="json").status_code == 400, body


def test_manage_py_token_creates_lists_and_revokes(cast):
    out = StringIO()
    call_command(
        "token", "create", "--user", "otto", "--name", "ci", "--scope", "fleet:write", stdout=out
    )
    secret = out.getvalue().strip()
    token = token_for_secret(secret)
    assert token is not None and token.scopes == ["fleet:write"]
    out = StringIO()
    call_command("token", "list", stdout=out)
    assert token.prefix in out.getvalue() and "live" in out.getvalue()
    call_command("token", "revoke", token.prefix, stdout=StringIO())
    assert token_for_secret(secret) is None
    out = StringIO()
    call_command("token", "list", stdout=out)
    assert token.prefix not in out.getvalue()
    out = StringIO()
    call_command("token", "list", "--all", stdout=out)
    assert "revoked" in out.getvalue()
    assert AuditLog.objects.filter(action="api_token.revoke", actor="cli:token").count() == 1


def test_manage_py_token_refuses_a_scope_beyond_the_role(cast):
    with pytest.raises(CommandError, match="never exceeds"):
        call_command(
            "token", "create", "--user", "vera", "--scope", "fleet:write", stdout=StringIO()
        )
    with pytest.raises(CommandError, match="no token"):
        call_command("token", "revoke", "zpt_nothing", stdout=StringIO())


def test_create_admin_makes_an_admin_with_an_argon2_password(monkeypatch):
    monkeypatch.setenv("ZOOMIES_ADMIN_PASSWORD", "a long enough password")
    call_command("create_admin", "root", stdout=StringIO())
    user = make_user.__globals__["User"].objects.get(username="root")
    assert user.role == "admin" and user.password.startswith("argon2$argon2id$")
    assert AuditLog.objects.filter(action="user.create", actor="cli:create_admin").exists()
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_admin", "root", stdout=StringIO())
    monkeypatch.setenv("ZOOMIES_ADMIN_PASSWORD", "short")
    with pytest.raises(CommandError, match="too short"):
        call_command("create_admin", "other", stdout=StringIO())
