"""Users: a custom model from the first migration, passwords hashed with argon2id."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from accounts.migrations import __path__ as migrations_path
from accounts.models import User


def test_auth01_the_user_model_is_ours_from_the_first_migration():

    assert get_user_model() is User
    first = (__import__("pathlib").Path(migrations_path[0]) / "0001_initial.py").read_text()
    assert '"User"' in first or "'User'" in first


@pytest.mark.django_db
def test_auth01_passwords_are_hashed_with_argon2id():
    user = User.objects.create_user(username="ada", password="correct horse battery staple")
    assert user.password.startswith("argon2$argon2id$")
    assert user.check_password("correct horse battery staple")
    assert not user.check_password("wrong")


def test_auth01_production_hashes_with_djangos_argon2_at_its_own_cost():
    """The suite's users get argon2id at its least cost (tests/hashers.py); the settings a
    controller runs with keep Django's hasher, whose cost is the point."""
    import zoomies_site.settings as production  # noqa: PLC0415  # the module, not the override

    assert production.PASSWORD_HASHERS[0] == "django.contrib.auth.hashers.Argon2PasswordHasher"
    assert settings.PASSWORD_HASHERS[0] == "tests.hashers.QuickArgon2PasswordHasher"
