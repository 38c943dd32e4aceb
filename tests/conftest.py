"""The shared cast for every test."""

from __future__ import annotations

import pytest


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_user(
        username="ada",
        password="correct horse battery",
        role="admin",
        is_staff=True,
        is_superuser=True,
    )
