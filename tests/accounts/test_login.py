"""Password sign-in: sessions with CSRF, and failures held per username and per address
(issue 10 item 2; SEC-02: authentication is on by default)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import authenticate
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory
from django.utils import timezone

from accounts import login
from accounts.models import LoginFailure
from tests.accounts.conftest import make_user
from zoomies_site.core import registry

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery"


@pytest.fixture
def ada():
    return make_user("ada", "admin", password=PASSWORD)


def sign_in(client: Client, username: str, password: str, ip: str = "10.0.0.1"):
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password},
        REMOTE_ADDR=ip,
    )


def test_sec02_the_api_and_the_admin_want_a_sign_in():
    client = Client()
    assert client.get("/api/v1/pools").status_code == 401
    assert client.get("/admin/").status_code == 302


def test_signing_in_gives_a_session_that_the_api_accepts(ada):
    client = Client()
    answer = sign_in(client, "ada", PASSWORD)
    assert answer.status_code == 302 and answer["Location"] == "/admin/"
    assert client.get("/api/v1/pools").status_code == 200


def test_a_session_write_without_the_csrf_token_is_refused(ada):
    client = Client(enforce_csrf_checks=True)
    client.force_login(ada)
    body = {"name": "zoomies-a", "labels": ["linux"], "backend": "process"}
    refused = client.post("/api/v1/pools", body, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    client.get("/admin/")  # the admin's pages set the csrftoken cookie
    token = client.cookies["csrftoken"].value
    allowed = client.post(
        "/api/v1/pools", body, content_type="application/json", HTTP_X_CSRFTOKEN=token
    )
    assert allowed.status_code == 201, allowed.content


def test_failures_for_one_username_hold_its_sign_ins_even_with_the_right_password(ada):
    limit = registry.get("auth.login_max_failures")
    client = Client()
    for i in range(limit):
        assert sign_in(client, "ada", f"wrong {i}", ip=f"10.0.0.{i}").status_code == 200
    held = sign_in(client, "ada", PASSWORD, ip="10.9.9.9")
    assert held.status_code == 200
    assert "Too many failed sign-ins for ada" in held.content.decode()
    assert "_auth_user_id" not in client.session
    # Another user is not held by ada's failures.
    make_user("bob", "viewer", password=PASSWORD)
    assert sign_in(Client(), "bob", PASSWORD, ip="10.9.9.9").status_code == 302


def test_the_hold_ends_when_the_failures_leave_the_window(ada):
    request = RequestFactory().post("/", REMOTE_ADDR="10.0.0.1")
    window = registry.get("auth.login_window")
    then = timezone.now() - window - timedelta(seconds=1)
    for _ in range(registry.get("auth.login_max_failures")):
        login.record_failure("ada", "10.0.0.1", now=then)
    assert login.refusal("ada", "10.0.0.1", now=then + timedelta(seconds=1))
    assert login.refusal("ada", "10.0.0.1") is None
    assert authenticate(request, username="ada", password=PASSWORD) == ada
    assert not LoginFailure.objects.filter(username="ada").exists()  # a success clears them


def test_failures_from_one_address_hold_every_username_from_it(ada, settings):
    limit = registry.get("auth.login_max_failures_per_ip")
    now = timezone.now()
    LoginFailure.objects.bulk_create(
        LoginFailure(at=now, username=f"guess{i}", ip="10.6.6.6") for i in range(limit)
    )
    request = RequestFactory().post("/", REMOTE_ADDR="10.6.6.6")
    with pytest.raises(PermissionDenied):
        login.RateLimitedModelBackend().authenticate(request, username="ada", password=PASSWORD)
    assert authenticate(request, username="ada", password=PASSWORD) is None
    elsewhere = RequestFactory().post("/", REMOTE_ADDR="10.7.7.7")
    assert authenticate(elsewhere, username="ada", password=PASSWORD) == ada


def test_usernames_are_counted_without_regard_to_case(ada):
    for _ in range(registry.get("auth.login_max_failures")):
        login.record_failure("ADA", "10.0.0.1")
    assert login.refusal("ada", "10.1.1.1")


def test_failed_sign_ins_and_the_hold_they_cause_are_audited(ada):
    """Issue 21 item 15: each failed sign-in is an audit row (the username tried, the
    address), and so is the failure that puts the username on hold; a held attempt writes
    nothing more (the hold is already on record)."""
    from accounts.models import AuditLog  # noqa: PLC0415

    limit = registry.get("auth.login_max_failures")
    client = Client()
    for i in range(limit):
        sign_in(client, "Ada", f"wrong {i}", ip="10.0.0.7")
    sign_in(client, "ada", PASSWORD, ip="10.0.0.7")  # held
    failed = AuditLog.objects.filter(action="auth.sign_in_failed")
    assert failed.count() == limit
    assert failed.first().detail == {"username": "ada", "ip": "10.0.0.7"}
    assert failed.first().actor == "anonymous"
    (held,) = AuditLog.objects.filter(action="auth.sign_in_held")
    assert held.detail["username"] == "ada" and "Too many failed sign-ins" in held.detail["why"]
