"""Argon2id at the least cost argon2 allows, for the users the suite makes by the hundred.

Django's Argon2PasswordHasher (production's, zoomies_site/settings.py) spends about 0.12 CPU-s
a hash here: 100 MiB, two passes, on purpose. The suite makes a few hundred users a pass, so
tests/conftest.py puts this one in its place. The algorithm, the stored format
(`argon2$argon2id$...`) and Django's verify path are the same; only the cost differs.
tests/accounts/test_users.py checks that production keeps Django's own.
"""

from __future__ import annotations

from django.contrib.auth.hashers import Argon2PasswordHasher


class QuickArgon2PasswordHasher(Argon2PasswordHasher):
    time_cost = 1
    memory_cost = 8  # KiB: argon2's least, eight per lane
    parallelism = 1
