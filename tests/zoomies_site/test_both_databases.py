"""STORE-05: the test suite passes on SQLite and on PostgreSQL. The test command runs it on
both (scripts/test.sh: the SQLite pass, and beside it the database tests on PostgreSQL) and
fails if either fails; each pass really is on its database, which this test, run in both,
checks from inside."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_store05_each_pass_runs_on_the_database_it_names():
    expected = "postgresql" if os.environ.get("ZOOMIES_DATABASE_URL") else "sqlite"
    assert connection.vendor == expected
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_store05_the_test_command_runs_both_passes_and_fails_if_either_does():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r'ZOOMIES_DATABASE_URL="\$PG_URL"[^\n]*"\$\{PG_PYTEST\[@\]\}"', script)
    assert re.search(r'^"\$\{PYTEST\[@\]\}" "\$@" \|\| sqlite_status=\$\?$', script, re.M)
    assert '[ "$sqlite_status" -eq 0 ] && [ "$pg_status" -eq 0 ]' in script
    # Skipping the PostgreSQL pass is said, never silent.
    assert "PostgreSQL run NOT done" in script
