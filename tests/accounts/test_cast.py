"""The named cast in tests/conftest.py is what its names say."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_the_cast_has_one_user_per_role_and_a_switched_off_outsider(
    admin, operator, viewer, outsider
):
    assert [u.role for u in (admin, operator, viewer)] == ["admin", "operator", "viewer"]
    assert outsider.is_active is False


def test_the_outsider_is_refused_even_when_signed_in(outsider):
    client = APIClient()
    client.force_login(outsider)
    assert client.get("/api/v1/pools").status_code in (401, 403)


def test_each_scope_token_reaches_its_level_and_no_further(token_for):
    def client(scope: str) -> APIClient:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for[scope]}")
        return api

    assert client("fleet:read").get("/api/v1/pools").status_code == 200
    assert client("fleet:read").post("/api/v1/pools", {}, format="json").status_code == 403
    assert client("fleet:write").post("/api/v1/pools", {}, format="json").status_code == 400
    assert client("admin").get("/api/v1/audit").status_code == 200
