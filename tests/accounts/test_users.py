"""Users: a custom model from the first migration, passwords hashed with argon2id."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import Argon2PasswordHasher, make_password

from accounts.migrations import __path__ as migrations_path
from accounts.models import User
from tests.hashers import QuickArgon2PasswordHasher

ROOT = Path(__file__).resolve().parents[2]


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


def _cost(stored: str) -> tuple[int, int, int]:
    decoded = Argon2PasswordHasher().decode(stored)
    return decoded["memory_cost"], decoded["time_cost"], decoded["parallelism"]


def test_auth01_a_process_on_the_production_settings_hashes_at_djangos_argon2_cost():
    """The suite's own users get argon2id at its least cost (tests/hashers.py); a process on
    the settings a controller runs with (as every one the tests start) hashes at Django's."""
    code = (
        "import django; django.setup(); "
        "from django.contrib.auth.hashers import make_password; print(make_password('pw'))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "zoomies_site.settings"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    djangos = Argon2PasswordHasher()
    quick = QuickArgon2PasswordHasher()
    assert _cost(done.stdout.strip().splitlines()[-1]) == (
        djangos.memory_cost,
        djangos.time_cost,
        djangos.parallelism,
    )
    assert _cost(make_password("pw")) == (quick.memory_cost, quick.time_cost, quick.parallelism)
    assert djangos.memory_cost > quick.memory_cost
