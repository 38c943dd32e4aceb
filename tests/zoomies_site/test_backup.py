"""Backups and restores on the live database (issue 11 items 6 and 7; BAK-01..03, BAK-05).

These run on SQLite's file (the test database is a file, see settings.py): the copy is taken
with VACUUM INTO from a connection of its own and the restore swaps the file, so each test
is transactional (committed rows, no wrapping transaction).
"""

from __future__ import annotations

import io
import json
import os
import socket
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.utils import timezone

from accounts import actions as account_actions
from accounts.models import AuditLog, User
from runners.models import Job, Runner
from tests.runners.conftest import make_host, make_runner
from zoomies_site import actions as site_actions
from zoomies_site.backup import crypto, service
from zoomies_site.core import controller_lock
from zoomies_site.core.models import Lease

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "sqlite",
        reason="SQLite's file; PostgreSQL's pg_dump path is test_backup_postgres.py",
    ),
]


def populate(tag: str = "a") -> None:
    """A little of everything, made the way the product makes it."""
    admin = User.objects.create_user(username=f"ada-{tag}", password="pw-long-enough", role="admin")
    account_actions.create_api_token(
        user=admin, name=f"ci-{tag}", scopes=["fleet:read"], expires_at=None, actor="test"
    )
    site_actions.set_setting("scheduler.idle_timeout", "5m", actor="test")
    host = make_host(f"zoomies-host-{tag}")
    runner = make_runner(state="busy", host=host)
    now = timezone.now()
    Job.objects.create(
        github_id=abs(hash(tag)) % 10**9, repository="acme/app", labels=["self-hosted"],
        status="in_progress", runner=runner, runner_name=runner.name, created_at=now,
        updated_at=now,
    )  # fmt: skip


def logical_content() -> dict[str, list]:
    """Every model's rows (every field, by primary key) and the migration table."""
    tables: dict[str, list] = {}
    for model in apps.get_models(include_auto_created=True):
        rows = list(model.objects.order_by("pk").values())
        tables[model._meta.db_table] = rows
    with connection.cursor() as cursor:
        cursor.execute("SELECT app, name FROM django_migrations ORDER BY app, name")
        tables["django_migrations"] = [tuple(r) for r in cursor.fetchall()]
    return tables


def without_restore_audit(tables: dict[str, list]) -> dict[str, list]:
    """The restore records itself in the restored database's audit log: one row, set apart."""
    audit = AuditLog._meta.db_table
    restored = [r for r in tables[audit] if r["action"] == "backup.restored"]
    assert len(restored) == 1, restored
    return {**tables, audit: [r for r in tables[audit] if r["action"] != "backup.restored"]}


def assert_same(actual: dict[str, list], expected: dict[str, list]) -> None:
    assert actual.keys() == expected.keys()
    for table in expected:  # table by table, so a failure names the table
        assert actual[table] == expected[table], table


def test_bak01_a_backup_is_one_vacuum_into_copy_with_a_manifest(settings):
    """BAK-01: a consistent copy with a manifest (version, migrations, engine, size, sha256,
    when and by whom) beside it."""
    populate()
    taken = service.take(actor="test:bak01")
    manifest = json.loads((taken.path.parent / (taken.path.name + ".manifest.json")).read_text())
    assert manifest == taken.manifest
    assert taken.path.parent == Path(settings.DATA_DIR) / "backups"
    assert service.NAME_RE.match(taken.path.name) and taken.path.suffix == ".sqlite3"
    assert manifest["engine"] == "sqlite" and manifest["engine_version"] == sqlite3.sqlite_version
    assert manifest["zoomies_version"] == "0.1.0"  # pyproject.toml's
    assert manifest["migrations"] == service.applied_migrations()
    assert "runners.0001_initial" in manifest["migrations"]
    assert manifest["size"] == taken.path.stat().st_size
    assert manifest["sha256"] == service.sha256(taken.path)
    assert manifest["created_by"] == "test:bak01" and manifest["encrypted"] is False
    assert taken.path.stat().st_mode & 0o077 == 0, "a backup holds secrets: owner only"
    copy = sqlite3.connect(taken.path)
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert copy.execute("SELECT count(*) FROM runners_job").fetchone() == (1,)
    copy.close()
    # The copy is one plain file: no WAL beside it.
    assert sorted(p.name for p in taken.path.parent.iterdir()) == [
        taken.path.name, taken.path.name + ".manifest.json"
    ]  # fmt: skip
    assert AuditLog.objects.filter(action="backup.created", actor="test:bak01").exists()


def test_bak01_on_a_terminal_the_copy_itself_draws_a_bar_and_a_pipe_gets_none():
    populate()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, piped = Terminal(), io.StringIO()
    taken = service.take(actor="test:bak01", stream=tty)
    assert tty.getvalue().startswith("copying [")
    last = tty.getvalue().splitlines()[-1]
    assert last.startswith("copying [" + "#" * 30 + "] 100%")
    assert taken.manifest["plain_size"] > 0
    service.take(actor="test:bak01", stream=piped)
    assert piped.getvalue() == ""


def test_bak02_backups_are_listed_newest_first_and_verify(tmp_path):
    """BAK-02: list and verify (checksum, opens, integrity check, migration state)."""
    populate()
    first = service.take(actor="test", now=timezone.now() - timedelta(hours=1))
    second = service.take(actor="test")
    listed = service.list_backups()
    assert [e["file"] for e in listed] == [second.path.name, first.path.name]
    assert all(e["present"] and e["error"] is None for e in listed)

    report = service.verify(second.path.name)
    assert report.ok, report.as_dict()
    assert [c.name for c in report.checks] == ["checksum", "integrity", "migrations"]

    out = io.StringIO()
    call_command("backup", "verify", second.path.name, stdout=out)
    assert "ok   integrity: PRAGMA integrity_check: ok" in out.getvalue()
    out = io.StringIO()
    call_command("backup", "list", stdout=out)
    assert out.getvalue().index(second.path.name) < out.getvalue().index(first.path.name)


def _rewrite_manifest(path: Path, **changes) -> None:
    manifest_path = path.with_name(path.name + ".manifest.json")
    manifest = json.loads(manifest_path.read_text())
    manifest.update(changes)
    manifest_path.write_text(json.dumps(manifest))


def test_bak02_a_corrupted_backup_fails_verify():
    """BAK-02: a byte changed after the copy fails the checksum; a copy damaged inside (its
    manifest describing the damaged bytes) fails the integrity check."""
    populate()
    taken = service.take(actor="test")
    data = bytearray(taken.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    taken.path.write_bytes(bytes(data))
    report = service.verify(taken.path.name)
    assert not report.ok
    assert report.checks[0].name == "checksum" and not report.checks[0].ok

    # Damage inside the file: wipe a b-tree page, then make the manifest agree with it.
    data = bytearray(service.take(actor="test").path.read_bytes())
    path = sorted(service.backup_dir().glob("*.sqlite3"))[-1]
    page = 4096
    data[2 * page : 3 * page] = b"\x0d" + b"\xee" * (page - 1)
    path.write_bytes(bytes(data))
    _rewrite_manifest(path, sha256=service.sha256(path), size=len(data))
    report = service.verify(path.name)
    assert not report.ok
    integrity = [c for c in report.checks if c.name == "integrity"][0]
    assert not integrity.ok and integrity.detail != "PRAGMA integrity_check: ok"
    with pytest.raises(CommandError, match="failed verification"):
        call_command("backup", "verify", path.name, stdout=io.StringIO())


def test_bak03_an_encrypted_backup_verifies_and_a_wrong_passphrase_is_a_clear_error(tmp_path):
    """BAK-03: encrypted with a passphrase (scrypt, AES-256-GCM in chunks); a wrong
    passphrase is a sentence, not a traceback."""
    populate()
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("correct horse battery staple\n")
    bad.write_text("incorrect horse\n")
    out = io.StringIO()
    call_command("backup", "--encrypt", "--passphrase-file", str(good), stdout=out)
    path = next(service.backup_dir().glob("*.enc"))
    assert crypto.is_encrypted(path)
    assert b"runners_job" not in path.read_bytes(), "no plaintext schema in the file"
    manifest = service.read_manifest(path)
    assert manifest["encrypted"] and manifest["sha256"] == service.sha256(path)
    assert manifest["plain_sha256"] != manifest["sha256"]

    assert service.verify(path.name, passphrase="correct horse battery staple").ok
    report = service.verify(path.name, passphrase="incorrect horse")
    decrypts = [c for c in report.checks if c.name == "decrypts"][0]
    assert not decrypts.ok and decrypts.detail == "the passphrase is wrong for this backup"
    with pytest.raises(CommandError, match="failed verification"):
        call_command("backup", "verify", path.name, "--passphrase-file", str(bad),
                     stdout=(out := io.StringIO()))  # fmt: skip
    assert "FAIL decrypts: the passphrase is wrong for this backup" in out.getvalue()
    assert "Traceback" not in out.getvalue()
    with pytest.raises(CommandError, match="passphrase is wrong"):
        call_command("restore", str(path), "--passphrase-file", str(bad), "--force",
                     stdout=io.StringIO())  # fmt: skip
    no_passphrase = service.verify(path.name)
    assert not no_passphrase.ok and "give its passphrase" in no_passphrase.checks[-1].detail


def test_bak03_encryption_detects_tampering_truncation_and_reordering(tmp_path):
    """BAK-03: the chunked scheme is authenticated end to end."""
    plain = tmp_path / "plain"
    plain.write_bytes(bytes(range(256)) * 9000)  # a little over 2 chunks
    sealed = tmp_path / "sealed"
    crypto.encrypt_file(plain, sealed, "pass phrase")
    crypto.decrypt_file(sealed, tmp_path / "back", "pass phrase")
    assert (tmp_path / "back").read_bytes() == plain.read_bytes()

    raw = sealed.read_bytes()
    last_chunk = len(plain.read_bytes()) % crypto.CHUNK + 16 + 4  # its length prefix and tag
    cases = {
        "flipped": raw[:-100] + bytes([raw[-100] ^ 1]) + raw[-99:],
        "truncated mid-chunk": raw[: len(raw) // 2],
        "last chunk dropped": raw[:-last_chunk],
        "data appended": raw + raw[-last_chunk:],
    }
    for label, damaged in cases.items():
        broken = tmp_path / f"broken-{label}"
        broken.write_bytes(damaged)
        with pytest.raises(crypto.CryptoError):
            crypto.decrypt_file(broken, tmp_path / f"out-{label}", "pass phrase")
        assert not (tmp_path / f"out-{label}").exists(), "no half-decrypted file is left"
    with pytest.raises(crypto.WrongPassphrase):
        crypto.decrypt_file(sealed, tmp_path / "never", "another phrase")


def _mutate_after_backup() -> None:
    """Changes made after the copy, which a restore must undo."""
    populate("b")
    Job.objects.filter(status="in_progress").update(status="completed", conclusion="success")
    User.objects.filter(username="ada-a").delete()


def test_bak05_restore_puts_the_copy_back_table_by_table_and_keeps_the_old_one_aside():
    """BAK-05: restore from a local file; every table's rows are the copy's again, ids are
    not handed out twice, and the database it replaced is kept aside, whole and readable."""
    populate()
    expected = logical_content()
    taken = service.take(actor="test")
    _mutate_after_backup()
    changed = logical_content()
    assert changed != expected
    last_runner = max(r["id"] for r in changed[Runner._meta.db_table])

    out = io.StringIO()
    call_command("restore", taken.path.name, stdout=out)
    assert f"restored {taken.path.name}" in out.getvalue()
    assert_same(without_restore_audit(logical_content()), expected)
    # A runner made after the backup may live on at its host under its id: never reused.
    assert make_runner(state="provisioning").id > last_runner

    live = Path(connection.settings_dict["NAME"])
    asides = list(live.parent.glob(live.name + ".before-restore-*"))
    try:
        kept = [a for a in asides if not a.name.endswith(("-wal", "-shm"))]
        assert [str(a) for a in kept] == [out.getvalue().split("kept at ")[1].split()[0]]
        # The database itself, not its -wal or -shm (the glob's order is the directory's).
        old = sqlite3.connect(kept[0])
        assert old.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert old.execute("SELECT count(*) FROM accounts_user WHERE username='ada-b'").fetchone()
        assert old.execute(
            "SELECT count(*) FROM runners_job WHERE status='in_progress'"
        ).fetchone() == (0,)
        old.close()
    finally:
        # Opening the kept copy made its own -wal and -shm: those go too, or the next test
        # of this worker finds them and thinks a refused restore swapped something.
        for aside in live.parent.glob(live.name + ".before-restore-*"):
            aside.unlink()


def test_bak05_restore_refuses_while_a_controller_holds_the_lease_or_the_lock():
    """BAK-05: a live controller's lease or file lock refuses a restore, naming it;
    --force restores anyway; a lease left by this host's dead controller does not refuse."""
    populate()
    taken = service.take(actor="test")
    now = timezone.now()
    Lease.objects.update_or_create(
        name=controller_lock.LEASE_NAME,
        defaults={"holder": "otherhost:4242", "expires_at": now + timedelta(seconds=30)},
    )
    with pytest.raises(CommandError, match=r"host otherhost, pid 4242.*--force"):
        call_command("restore", taken.path.name, stdout=io.StringIO())
    assert User.objects.filter(username="ada-a").exists()

    Lease.objects.filter(name=controller_lock.LEASE_NAME).update(holder="", expires_at=None)
    fd = controller_lock.take_file_lock(controller_lock.lock_path())  # a controller's lock
    try:
        with pytest.raises(service.RestoreRefused, match="another controller holds"):
            service.restore(taken.path.name, actor="test")
    finally:
        os.close(fd)

    # A lease this host's killed controller left: the free file lock proves it gone (LEASE-06).
    Lease.objects.filter(name=controller_lock.LEASE_NAME).update(
        holder=f"{socket.gethostname()}:999999", expires_at=now + timedelta(seconds=30)
    )
    service.restore(taken.path.name, actor="test").aside.unlink()

    Lease.objects.filter(name=controller_lock.LEASE_NAME).update(
        holder="otherhost:4242", expires_at=now + timedelta(seconds=30)
    )
    User.objects.filter(username="ada-a").delete()
    restored = service.restore(taken.path.name, actor="test", force=True)
    assert User.objects.filter(username="ada-a").exists()
    restored.aside.unlink()


def test_bak05_restore_refuses_a_copy_newer_than_the_code():
    """BAK-05: a copy with migrations this code does not know is refused; verify says why."""
    populate()
    taken = service.take(actor="test")
    copy = sqlite3.connect(taken.path)
    copy.execute(
        "INSERT INTO django_migrations (app, name, applied) "
        "VALUES ('runners', '9999_from_the_future', '2030-01-01')"
    )
    copy.commit()
    copy.close()
    _rewrite_manifest(taken.path, sha256=service.sha256(taken.path),
                      size=taken.path.stat().st_size,
                      plain_sha256=service.sha256(taken.path))  # fmt: skip
    report = service.verify(taken.path.name)
    assert not report.ok and "runners.9999_from_the_future" in report.checks[-1].detail
    before = logical_content()
    live = Path(connection.settings_dict["NAME"])
    # What earlier restores on this worker's database set aside stays; none may be added.
    set_aside = set(live.parent.glob(live.name + ".before-restore-*"))
    with pytest.raises(CommandError, match="newer than this code"):
        call_command("restore", taken.path.name, stdout=io.StringIO())
    assert logical_content() == before
    added = set(live.parent.glob(live.name + ".before-restore-*")) - set_aside
    assert not added, "nothing was swapped"


def test_bak01_a_backup_taken_while_writes_run_restores_to_a_sound_database():
    """BAK-01, BAK-05 (issue 11 item 9, the backup drill's core): copies taken while another
    connection commits rows as fast as it can are consistent (each holds a gap-free prefix of
    the rows), pass integrity_check, and one restores to a database that passes it too."""
    stop = threading.Event()
    written = []

    def writer():
        try:
            n = 0
            while not stop.is_set():
                AuditLog.objects.create(actor="writer", action="burst", detail={"n": n},
                                        at=timezone.now())  # fmt: skip
                written.append(n)
                n += 1
        finally:
            connections.close_all()

    thread = threading.Thread(target=writer)
    thread.start()
    copies = []
    try:
        while len(written) < 50:
            stop.wait(0.01)
        for _ in range(3):
            copies.append(service.take(actor="test"))
            target = len(written) + 50
            while len(written) < target and thread.is_alive():
                stop.wait(0.01)
    finally:
        stop.set()
        thread.join(timeout=30)
    seen = []
    for taken in copies:
        assert service.verify(taken.path.name).ok
        copy = sqlite3.connect(taken.path)
        numbers = [json.loads(d)["n"] for (d,) in copy.execute(
            "SELECT detail FROM accounts_auditlog WHERE action='burst' ORDER BY id")]  # fmt: skip
        copy.close()
        assert numbers == list(range(len(numbers))), "a copy holds a gap-free prefix"
        seen.append(len(numbers))
    assert seen == sorted(seen) and seen[0] > 0 and seen[-1] < len(written)

    restored = service.restore(copies[1].path.name, actor="test")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA integrity_check")
        assert cursor.fetchone() == ("ok",)
    assert AuditLog.objects.filter(action="burst").count() == seen[1]
    restored.aside.unlink()


def test_bak05_a_restored_file_that_fails_its_check_in_place_puts_the_old_one_back(tmp_path):
    """BAK-05: the database being replaced stays aside until the restored one has opened and
    passed its integrity check; when it does not, the old one is put back."""
    populate()
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(service.take(actor="test").path.read_bytes())
    before = logical_content()
    data = bytearray(damaged.read_bytes())
    data[2 * 4096 : 3 * 4096] = b"\x0d" + b"\xee" * 4095
    damaged.write_bytes(bytes(data))
    with pytest.raises(service.BackupError, match="failed its integrity check.*back in place"):
        service._swap_sqlite(damaged, "20990101T000000Z")
    assert logical_content() == before
    live = Path(connection.settings_dict["NAME"])
    failed = live.with_name(live.name + ".failed-restore-20990101T000000Z")
    try:
        assert failed.exists()
        assert not list(live.parent.glob(live.name + ".before-restore-20990101T000000Z*"))
    finally:
        failed.unlink(missing_ok=True)
