"""The accounts cast: a user per role, and tokens made by calling the actions."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts import actions
from accounts.models import User


@pytest.fixture(autouse=True)
def fresh_registry(registry_defaults):
    """Every test here starts from the registry's defaults (the root `registry_defaults`)."""
    return registry_defaults


def make_user(username: str, role: str, password: str | None = None) -> User:
    return actions.create_user(username=username, role=role, password=password, actor="test")


def mint(user: User, scopes: list[str], name: str = "t") -> str:
    _token, secret = actions.create_api_token(user=user, name=name, scopes=scopes, actor="test")
    return secret


@pytest.fixture
def cast(db):
    return {
        role: make_user(name, role)
        for name, role in (("ada", "admin"), ("otto", "operator"), ("vera", "viewer"))
    }


def client_for(user: User | None = None, token: str | None = None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_login(user)
    if token is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client
