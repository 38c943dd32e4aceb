"""The dashboard's cast: users per role (accounts' actions) and a clean registry."""

from __future__ import annotations

import pytest

from tests.accounts.conftest import client_for, fresh_registry, make_user, mint  # noqa: F401


@pytest.fixture
def cast(db):
    return {
        role: make_user(name, role)
        for name, role in (("ada", "admin"), ("otto", "operator"), ("vera", "viewer"))
    }
