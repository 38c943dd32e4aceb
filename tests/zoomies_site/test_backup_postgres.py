"""Backups on PostgreSQL (issue 11 items 6 and 7; BAK-01, BAK-02, BAK-05): `pg_dump` in
custom format, verified with `pg_restore --list` and the archive's own django_migrations, and
restored with `pg_restore --single-transaction` after a dump of the database it replaces is
kept aside. Runs in the suite's PostgreSQL pass (scripts/test.sh); SQLite's file path is
test_backup.py's.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from tests.zoomies_site.test_backup import (
    _mutate_after_backup,
    assert_same,
    logical_content,
    populate,
    without_restore_audit,
)
from zoomies_site.backup import service

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL pass only"),
]


def test_bak01_bak05_pg_dump_backup_verifies_and_restores_table_by_table(tmp_path):
    populate()
    expected = logical_content()
    passphrase = tmp_path / "passphrase"
    passphrase.write_text("a long enough passphrase for the test\n")
    call_command("backup", "--encrypt", "--passphrase-file", str(passphrase),
                 stdout=io.StringIO())  # fmt: skip
    path = next(service.backup_dir().glob("zoomies-*.pgdump.enc"))
    manifest = service.read_manifest(path)
    assert manifest["engine"] == "postgresql" and manifest["engine_version"]
    assert manifest["migrations"] == service.applied_migrations()

    report = service.verify(path.name, passphrase=passphrase.read_text().strip())
    assert report.ok, report.as_dict()
    assert [c.name for c in report.checks] == ["checksum", "decrypts", "opens", "migrations"]

    _mutate_after_backup()
    out = io.StringIO()
    call_command("restore", path.name, "--passphrase-file", str(passphrase), stdout=out)
    assert_same(without_restore_audit(logical_content()), expected)
    aside = service.backup_dir().glob("before-restore-*.pgdump")
    assert len(list(aside)) == 1, out.getvalue()
