"""Backups and restores: the one module the commands, the API and the scheduled task call
(BAK-01..06), so all three write and read one layout.

The layout, in `backup.dir` (default `<data dir>/backups`) and under each remote's prefix:

    zoomies-20261201T054000Z.sqlite3[.enc]                 the copy (`.pgdump` on PostgreSQL)
    zoomies-20261201T054000Z.sqlite3[.enc].manifest.json   what it is

The copy is consistent: SQLite's `VACUUM INTO` from a connection of its own (a read
transaction: writers carry on under WAL; it refuses an existing target and cannot run inside a
transaction, hence the connection of its own), or `pg_dump --format=custom` (one snapshot).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

from accounts import audit
from zoomies_site.backup import crypto, plan, remote
from zoomies_site.backup.progress import Progress, watching
from zoomies_site.core import controller_lock, registry
from zoomies_site.core.models import Lease
from zoomies_site.ticker import enqueue

MANIFEST_SUFFIX = remote.MANIFEST_SUFFIX
FORMAT = 1
NAME_RE = re.compile(r"^zoomies-(\d{8}T\d{6}Z)(?:-\d+)?\.(sqlite3|pgdump)(\.enc)?$")


class BackupError(Exception):
    """What went wrong, in a sentence an operator can act on (never a traceback)."""


class RestoreRefused(BackupError):
    """The restore would be unsafe: a controller holds the database, or the copy is newer."""


class NoSuchBackup(BackupError):
    """No backup of that name is in backup.dir (or the name is not a backup's)."""


# --- where and what ------------------------------------------------------------------------


def backup_dir() -> Path:
    configured = registry.get("backup.dir")
    return Path(configured) if configured else Path(settings.DATA_DIR) / "backups"


def engine() -> str:
    return "sqlite" if connection.vendor == "sqlite" else connection.vendor


def zoomies_version() -> str:
    try:
        with open(Path(settings.BASE_DIR) / "pyproject.toml", "rb") as handle:
            return str(tomllib.load(handle)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def engine_version() -> str:
    if engine() == "sqlite":
        return sqlite3.sqlite_version
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return str(cursor.fetchone()[0])


def code_migrations() -> set[tuple[str, str]]:
    """Every migration this code knows, applied or not."""
    return set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)


def applied_migrations() -> list[str]:
    recorder = MigrationRecorder(connection)
    return sorted(f"{app}.{name}" for app, name in recorder.applied_migrations())


def migration_state(applied: list[str]) -> tuple[list[str], list[str]]:
    """(migrations the copy has that this code does not know, ones it lacks that code has)."""
    known = {f"{app}.{name}" for app, name in code_migrations()}
    return sorted(set(applied) - known), sorted(known - set(applied))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def _sqlite_path() -> Path:
    return Path(connection.settings_dict["NAME"])


def _pg_env() -> dict[str, str]:
    db = connection.settings_dict
    env = {**os.environ}
    for var, key in (("PGHOST", "HOST"), ("PGPORT", "PORT"), ("PGUSER", "USER"),
                     ("PGPASSWORD", "PASSWORD")):  # fmt: skip
        if db.get(key):
            env[var] = str(db[key])
    return env


def _pg_tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise BackupError(
            f"{name} is not installed: a PostgreSQL backup needs the PostgreSQL client tools "
            "(apt-get install postgresql-client)"
        )
    return found


def _run(argv: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise BackupError(f"{what} failed: {done.stderr.strip()[-500:]}")
    return done


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def cli_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"cli:{user}@{socket.gethostname()}"


# --- taking a copy -------------------------------------------------------------------------


@dataclass
class Taken:
    path: Path
    manifest: dict
    uploaded: list[str] = field(default_factory=list)


def _copy_sqlite(target: Path, stream: TextIO | None = None) -> None:
    source = _sqlite_path()
    if not source.exists():
        raise BackupError(f"there is no database at {source} to back up")
    con = sqlite3.connect(source, timeout=20, isolation_level=None)
    try:
        # The copy holds the pages in use: the bar's whole is the file less its free list.
        (pages,) = con.execute("PRAGMA page_count").fetchone()
        (free,) = con.execute("PRAGMA freelist_count").fetchone()
        (page_size,) = con.execute("PRAGMA page_size").fetchone()
        progress = Progress("copying", (pages - free) * page_size, stream)
        with watching(target, progress):
            con.execute("VACUUM INTO ?", (str(target),))
        progress.total = max(progress.done, 1)  # the estimate's whole gives way to the copy's
        progress.finish()
    except sqlite3.Error as exc:
        raise BackupError(f"VACUUM INTO {target.name} failed: {exc}") from None
    finally:
        con.close()


def _copy_postgres(target: Path) -> None:
    db = connection.settings_dict
    _run(
        [_pg_tool("pg_dump"), "--format=custom", "--no-owner", "--no-privileges",
         f"--file={target}", db["NAME"]],
        "pg_dump", env=_pg_env(), timeout=3600,
    )  # fmt: skip


def _free_name(directory: Path, now: datetime, ext: str) -> str:
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1, 1000):
        name = f"zoomies-{stamp}{'' if n == 1 else f'-{n}'}.{ext}"
        if not any(directory.glob(name + "*")):
            return name
    raise BackupError(f"too many backups named for {stamp} in {directory}")


def take(
    *,
    actor: str,
    passphrase: str = "",
    directory: Path | None = None,
    remotes: list[str] | None = None,
    stream: TextIO | None = None,
    now: datetime | None = None,
) -> Taken:
    """One consistent copy of the live database with its manifest, encrypted under
    `passphrase` if given, and uploaded to each of `remotes` (s3:// URLs)."""
    now = now or timezone.now()
    directory = directory or backup_dir()
    directory.mkdir(parents=True, exist_ok=True)
    kind = engine()
    ext = "sqlite3" if kind == "sqlite" else "pgdump"
    name = _free_name(directory, now, ext)
    plain = directory / f".{name}.partial"
    plain.unlink(missing_ok=True)  # a crashed earlier attempt; VACUUM INTO refuses a target
    try:
        if kind == "sqlite":
            _copy_sqlite(plain, stream)
        elif kind == "postgresql":
            _copy_postgres(plain)
        else:
            raise BackupError(f"backups of a {kind} database are not supported")
        plain_sha, plain_size = sha256(plain), plain.stat().st_size
        if passphrase:
            name += ".enc"
            final = directory / name
            progress = Progress("encrypting", plain_size, stream)
            crypto.encrypt_file(plain, directory / f".{name}.partial", passphrase,
                                progress=progress)  # fmt: skip
            progress.finish()
            os.replace(directory / f".{name}.partial", final)
        else:
            final = directory / name
            os.replace(plain, final)
        final.chmod(0o600)  # the copy holds every sealed secret and token hash
    finally:
        plain.unlink(missing_ok=True)
        (directory / f".{name}.partial").unlink(missing_ok=True)
    manifest = {
        "format": FORMAT,
        "file": name,
        "zoomies_version": zoomies_version(),
        "engine": kind,
        "engine_version": engine_version(),
        "migrations": applied_migrations(),
        "size": final.stat().st_size,
        "sha256": sha256(final),
        "plain_size": plain_size,
        "plain_sha256": plain_sha,
        "encrypted": bool(passphrase),
        "encryption": "scrypt + AES-256-GCM, 1 MiB chunks" if passphrase else None,
        "created_at": now.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "created_by": actor,
        "host": socket.gethostname(),
    }
    _write_json(directory / (name + MANIFEST_SUFFIX), manifest)
    taken = Taken(final, manifest)
    try:
        for url in remotes or []:
            upload(final, url, stream=stream)
            taken.uploaded.append(url)
    except BackupError as exc:
        raise BackupError(f"{name} is taken and kept in {directory}, but {exc}") from None
    finally:
        _audit(actor, "backup.created", {"file": name, "remotes": taken.uploaded})
    return taken


def record_request(actor: str, action: str, detail: dict) -> None:
    """Audit an operator's request (take, verify) before the work runs: the request is the
    change an operator made, whatever the worker later makes of it (AUTH-06)."""
    with transaction.atomic(durable=True):
        audit.record(actor=actor, action=action, detail=detail)


def _audit(actor: str, action: str, detail: dict) -> None:
    try:
        with transaction.atomic(durable=True):
            audit.record(actor=actor, action=action, detail=detail)
    except DatabaseError:
        pass  # the copy is taken and described; an unwritable database must not undo that


# --- remotes -------------------------------------------------------------------------------


def s3_client():
    return remote.client(
        endpoint_url=registry.get("backup.s3_endpoint_url"),
        region=registry.get("backup.s3_region"),
        access_key=registry.get("backup.s3_access_key_id"),
        secret_key=registry.get("backup.s3_secret_access_key"),
    )


def upload(path: Path, url: str, *, stream: TextIO | None = None, s3=None) -> None:
    """Copy a backup and its manifest to the remote `url`, the manifest last: a listing
    never shows a manifest whose file is not there yet."""
    try:
        target = remote.parse(url)
        s3 = s3 or s3_client()
        progress = Progress(f"uploading to {target.url}", path.stat().st_size, stream)
        remote.upload(s3, target, path, progress=progress)
        progress.finish()
        remote.upload(s3, target, path.with_name(path.name + MANIFEST_SUFFIX))
    except remote.RemoteError as exc:
        raise BackupError(str(exc)) from None


def download(url: str, directory: Path, *, stream: TextIO | None = None, s3=None) -> Path:
    """Fetch `s3://bucket/prefix/<backup file>` and its manifest into `directory`."""
    try:
        source, name = remote.split_object_url(url)
        if not NAME_RE.match(name):
            raise BackupError(f"{name!r} is not a backup file's name (zoomies-…sqlite3[.enc])")
        s3 = s3 or s3_client()
        remote.download(s3, source, name + MANIFEST_SUFFIX, directory / (name + MANIFEST_SUFFIX))
        progress = Progress(f"downloading {name}", remote.size(s3, source, name), stream)
        remote.download(s3, source, name, directory / name, progress=progress)
        progress.finish()
    except remote.RemoteError as exc:
        raise BackupError(str(exc)) from None
    return directory / name


# --- listing and verifying -----------------------------------------------------------------


def read_manifest(path: Path) -> dict:
    manifest_path = path.with_name(path.name + MANIFEST_SUFFIX)
    try:
        data = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise BackupError(f"{path.name} has no manifest beside it ({manifest_path.name})") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{manifest_path.name} cannot be read: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BackupError(f"{manifest_path.name} is not a manifest this version can read")
    return data


def list_backups(directory: Path | None = None) -> list[dict]:
    """Every backup in the directory, newest first: its manifest, and whether its file is
    there; a manifest that cannot be read is listed with its error."""
    directory = directory or backup_dir()
    found = []
    for manifest_path in sorted(directory.glob("zoomies-*" + MANIFEST_SUFFIX)):
        name = manifest_path.name[: -len(MANIFEST_SUFFIX)]
        path = directory / name
        try:
            entry = {**read_manifest(path), "present": path.exists(), "error": None}
        except BackupError as exc:
            entry = {"file": name, "present": path.exists(), "error": str(exc)}
        found.append(entry)
    found.sort(key=lambda e: (e.get("created_at") or "", e["file"]), reverse=True)
    return found


def list_remote(url: str, *, s3=None) -> list[dict]:
    """The backups at a remote, newest first: each manifest and the URL to restore it from."""
    try:
        target = remote.parse(url)
        s3 = s3 or s3_client()
        found = []
        for manifest_name in remote.manifests(s3, target):
            name = manifest_name[: -len(MANIFEST_SUFFIX)]
            try:
                entry = {**remote.read_json(s3, target, manifest_name), "error": None}
            except remote.RemoteError as exc:
                entry = {"file": name, "error": str(exc)}
            found.append({**entry, "url": f"{target.url}{name}"})
    except remote.RemoteError as exc:
        raise BackupError(str(exc)) from None
    found.sort(key=lambda e: (e.get("created_at") or "", e["file"]), reverse=True)
    return found


def resolve(name_or_path: str, directory: Path | None = None) -> Path:
    """A backup by its file name in the backup directory, or by a path. An empty name or a
    directory is no backup (issue 21 item 11: "" meant the current directory, and a
    traceback)."""
    if not name_or_path.strip():
        raise BackupError("name a backup: a file name in backup.dir, or a path to one")
    candidate = Path(name_or_path)
    if not (candidate.exists() or os.sep in name_or_path):
        candidate = (directory or backup_dir()) / name_or_path
    if candidate.is_dir():
        raise BackupError(f"{name_or_path!r} is a directory, not a backup")
    return candidate


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    path: Path
    checks: list[Check]
    manifest: dict | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def as_dict(self) -> dict:
        return {
            "file": self.path.name,
            "ok": self.ok,
            "checks": [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def _sqlite_facts(path: Path) -> tuple[str, list[str]]:
    """(PRAGMA integrity_check's answer, the copy's applied migrations) of a SQLite file."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute("PRAGMA integrity_check").fetchall()
            verdict = "; ".join(str(r[0]) for r in rows)[:500]
            try:
                applied = [f"{a}.{n}" for a, n in con.execute(
                    "SELECT app, name FROM django_migrations")]  # fmt: skip
            except sqlite3.Error:
                applied = []
            return verdict, sorted(applied)
        finally:
            con.close()
    except sqlite3.Error as exc:
        return f"it does not open as a SQLite database: {exc}", []


def _pgdump_facts(path: Path) -> tuple[str, list[str]]:
    """(whether pg_restore reads the archive, the migrations in its django_migrations)."""
    listing = subprocess.run([_pg_tool("pg_restore"), "--list", str(path)],
                             capture_output=True, text=True)  # fmt: skip
    if listing.returncode != 0:
        return f"pg_restore cannot read it: {listing.stderr.strip()[-300:]}", []
    data = subprocess.run(
        [_pg_tool("pg_restore"), "--data-only", "--table=django_migrations", "--file=-",
         str(path)], capture_output=True, text=True,
    )  # fmt: skip
    applied, copying = [], False
    for line in data.stdout.splitlines():
        if line.startswith("COPY ") and "django_migrations" in line:
            copying = True
        elif copying and line == "\\.":
            copying = False
        elif copying:
            parts = line.split("\t")
            if len(parts) >= 3:
                applied.append(f"{parts[1]}.{parts[2]}")
    return "ok", sorted(applied)


def _open_copy(path: Path, manifest: dict, passphrase: str, work: Path, checks: list[Check],
               stream: TextIO | None = None) -> Path | None:  # fmt: skip
    """The plain copy (decrypted into `work` if need be), or None after a failed check."""
    if not manifest.get("encrypted"):
        return path
    if not passphrase:
        checks.append(Check("decrypts", False, "it is encrypted: give its passphrase"))
        return None
    plain = work / "plain"
    progress = Progress("decrypting", manifest.get("plain_size") or 0, stream)
    try:
        crypto.decrypt_file(path, plain, passphrase, progress=progress)
    except crypto.CryptoError as exc:
        checks.append(Check("decrypts", False, str(exc)))
        return None
    progress.finish()
    digest = sha256(plain)
    if digest != manifest.get("plain_sha256"):
        checks.append(Check("decrypts", False, "the decrypted copy differs from the one taken"))
        return None
    checks.append(Check("decrypts", True, "decrypted, and its checksum matches"))
    return plain


def _examine(path: Path, manifest: dict, passphrase: str, work: Path,
             stream: TextIO | None = None) -> tuple[list[Check], Path | None]:  # fmt: skip
    checks: list[Check] = []
    size = path.stat().st_size
    digest = sha256(path)
    checks.append(Check(
        "checksum", digest == manifest.get("sha256") and size == manifest.get("size"),
        "sha256 and size match the manifest" if digest == manifest.get("sha256")
        else f"sha256 {digest[:16]}… is not the manifest's {str(manifest.get('sha256'))[:16]}…",
    ))  # fmt: skip
    if not checks[-1].ok:
        return checks, None
    plain = _open_copy(path, manifest, passphrase, work, checks, stream)
    if plain is None:
        return checks, None
    if manifest.get("engine") == "sqlite":
        verdict, applied = _sqlite_facts(plain)
        checks.append(Check("integrity", verdict == "ok", f"PRAGMA integrity_check: {verdict}"))
    elif manifest.get("engine") == "postgresql":
        verdict, applied = _pgdump_facts(plain)
        checks.append(Check("opens", verdict == "ok", f"pg_restore --list: {verdict}"))
    else:
        checks.append(Check("opens", False, f"unknown engine {manifest.get('engine')!r}"))
        return checks, None
    newer, older = migration_state(applied)
    if not applied:
        checks.append(Check("migrations", False, "the copy has no migration table"))
    elif newer:
        checks.append(Check(
            "migrations", False,
            f"the copy is newer than this code: it has {len(newer)} migration(s) this code "
            f"does not know ({', '.join(newer[:5])})",
        ))  # fmt: skip
    else:
        behind = f"; {len(older)} to apply on start" if older else ", the code's own state"
        checks.append(Check("migrations", True, f"{len(applied)} applied{behind}"))
    return checks, plain


def verify(
    name_or_path: str,
    *,
    passphrase: str = "",
    directory: Path | None = None,
    stream: TextIO | None = None,
) -> Report:
    """Checksum, decrypts, opens, integrity check, migration state against the code."""
    path = resolve(name_or_path, directory)
    if not path.exists():
        raise BackupError(f"there is no backup {name_or_path!r}")
    manifest = read_manifest(path)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".verify-") as work:
        checks, _plain = _examine(path, manifest, passphrase, Path(work), stream)
    return Report(path, checks, manifest)


# --- what an administrator asks for: the API and the Settings page ----------------------


def request_backup(*, actor: str, upload: bool) -> dict:
    """Queue a backup for a worker (a copy may take longer than a request should) and audit
    the request. It is encrypted with backup.passphrase when one is set (a passphrase never
    travels in a request or sits in the task queue) and copied to backup.remotes if `upload`.
    """
    if upload and not registry.get("backup.remotes"):
        raise BackupError("backup.remotes names no remote to copy to")
    task = enqueue("zoomies_site.backup.tasks.requested_backup_task", actor, upload)
    record_request(actor, "backup.requested", {"upload": upload, "task": task})
    return {"queued": True, "task": task, "encrypted": bool(registry.get("backup.passphrase"))}


def verify_named(name: str, *, actor: str) -> Report:
    """Verify the backup called `name` in backup.dir with backup.passphrase, the request
    audited; a name that is not a backup's there is NoSuchBackup (a path is never taken)."""
    if not NAME_RE.match(name):
        raise NoSuchBackup(f"{name!r} is not a backup")
    path = backup_dir() / name
    if not path.exists():
        raise NoSuchBackup(f"there is no backup {name!r}")
    record_request(actor, "backup.verify", {"file": name})
    return verify(str(path), passphrase=registry.get("backup.passphrase"))


# --- restoring -----------------------------------------------------------------------------


@dataclass
class Restored:
    source: str
    aside: Path | None
    report: Report
    pending_migrations: list[str]


def _guard(now: datetime) -> int:
    """Refuse while a controller holds the database; hold its file lock meanwhile so none
    starts halfway through. Returns the lock's descriptor."""
    try:
        fd = controller_lock.take_file_lock(controller_lock.lock_path())
    except controller_lock.ControllerRefused as exc:
        raise RestoreRefused(f"{exc} (or restore with --force)") from None
    try:
        if controller_lock.lease_table_exists():
            # Holding the file lock proves no controller on this host has the database, so
            # a lease this host's killed controller left is no obstacle (as LEASE-06 has it).
            held = (
                Lease.objects.filter(name=controller_lock.LEASE_NAME, expires_at__gt=now)
                .exclude(holder="")
                .exclude(holder__startswith=f"{socket.gethostname()}:")
                .first()
            )
            if held is not None:
                host, _, pid = held.holder.partition(":")
                raise RestoreRefused(
                    f"a controller holds the lease on this database (host {host}, pid {pid}, "
                    f"until {held.expires_at:%Y-%m-%d %H:%M:%S}Z): stop it first, or "
                    "restore with --force"
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _swap_sqlite(plain: Path, stamp: str) -> Path | None:
    """Put `plain` in the live database's place, keeping the old file (and its WAL) aside
    until the restored one has opened and passed its integrity check."""
    live = _sqlite_path()
    connections.close_all()
    aside = None
    counters: list[tuple[str, int]] = []
    if live.exists():
        con = sqlite3.connect(live, timeout=20, isolation_level=None)
        try:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            try:
                counters = con.execute("SELECT name, seq FROM sqlite_sequence").fetchall()
            except sqlite3.Error:
                counters = []  # a database with no AUTOINCREMENT table yet
        finally:
            con.close()
        aside = live.with_name(f"{live.name}.before-restore-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{live}{suffix}").exists():
                os.replace(f"{live}{suffix}", f"{aside}{suffix}")
    if aside is not None:
        os.chmod(plain, os.stat(aside).st_mode & 0o777)
    os.replace(plain, live)
    verdict, _applied = _sqlite_facts(live)
    if verdict != "ok":
        failed = live.with_name(f"{live.name}.failed-restore-{stamp}")
        os.replace(live, failed)
        if aside is not None:
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{aside}{suffix}").exists():
                    os.replace(f"{aside}{suffix}", f"{live}{suffix}")
        raise BackupError(
            f"the restored database failed its integrity check ({verdict}); the previous one "
            f"is back in place and the restored copy is at {failed}"
        )
    _keep_counters_ahead(live, counters)
    return aside


def _keep_counters_ahead(live: Path, counters: list[tuple[str, int]]) -> None:
    """No id is handed out twice across a restore: rows made after the backup (a runner, an
    agent task) may live on outside the database, on a host that tracks its workload by the
    runner's id, so each table's counter resumes past the replaced database's."""
    con = sqlite3.connect(live, timeout=20, isolation_level=None)
    try:
        for name, seq in counters:
            con.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (seq, name))
            if not con.execute("SELECT 1 FROM sqlite_sequence WHERE name = ?", (name,)).fetchone():
                con.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, seq))
    finally:
        con.close()


def _restore_postgres(plain: Path, stamp: str) -> Path:
    """Keep a dump of the current database aside, then restore in one transaction: a
    failure leaves the current database as it was."""
    aside = backup_dir() / f"before-restore-{stamp}.pgdump"
    aside.parent.mkdir(parents=True, exist_ok=True)
    _copy_postgres(aside)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT quote_ident(schemaname) || '.' || quote_ident(sequencename), last_value "
            "FROM pg_sequences WHERE last_value IS NOT NULL"
        )
        counters = cursor.fetchall()
    connections.close_all()
    _run(
        [_pg_tool("pg_restore"), "--clean", "--if-exists", "--single-transaction",
         "--exit-on-error", "--no-owner", "--no-privileges",
         f"--dbname={connection.settings_dict['NAME']}", str(plain)],
        "pg_restore", env=_pg_env(), timeout=3600,
    )  # fmt: skip
    # As on SQLite: ids resume past the replaced database's (see _keep_counters_ahead).
    with connection.cursor() as cursor:
        for sequence, last in counters:
            try:
                cursor.execute(
                    "SELECT setval(%s::regclass, GREATEST(%s, (SELECT last_value FROM "  # noqa: S608  # identifier quoted above
                    f"{sequence})))",  # quote_ident'ed above, from the catalogue
                    [sequence, last],
                )
            except DatabaseError:
                pass  # a sequence the older copy does not have: nothing there to reuse
    return aside


def restore(
    source: str,
    *,
    actor: str,
    passphrase: str = "",
    force: bool = False,
    stream: TextIO | None = None,
    now: datetime | None = None,
) -> Restored:
    """Put a backup (a path, a name in the backup directory, or an s3:// URL) back as the
    live database. Refused while a controller holds the database (unless `force`) and for a
    copy newer than the code; the database it replaces is kept aside."""
    now = now or timezone.now()
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    fd = None if force else _guard(now)
    try:
        kind = engine()
        # Beside the live database, so the final rename never crosses a filesystem.
        near = _sqlite_path().parent if kind == "sqlite" else backup_dir()
        near.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=near, prefix=".restore-") as work_dir:
            work = Path(work_dir)
            if source.startswith("s3://"):
                path = download(source, work, stream=stream)
            else:
                path = resolve(source)
                if not path.exists():
                    raise BackupError(f"there is no backup {source!r}")
            manifest = read_manifest(path)
            if manifest.get("engine") != kind:
                raise BackupError(
                    f"{path.name} is a {manifest.get('engine')} backup and this database is {kind}"
                )
            checks, plain = _examine(path, manifest, passphrase, work, stream)
            report = Report(path, checks, manifest)
            if not report.ok or plain is None:
                failed = [c for c in checks if not c.ok]
                why = "; ".join(f"{c.name}: {c.detail}" for c in failed)
                if any(c.name == "migrations" and "newer" in c.detail for c in failed):
                    raise RestoreRefused(f"{path.name} will not be restored: {why}")
                raise BackupError(f"{path.name} did not pass verification: {why}")
            if kind == "sqlite":
                candidate = work / "candidate.db"
                shutil.copyfile(plain, candidate)  # the backup itself stays as it was
                aside = _swap_sqlite(candidate, stamp)
            else:
                aside = _restore_postgres(plain, stamp)
        _newer, pending = migration_state(applied_migrations())
        _audit(actor, "backup.restored", {"file": path.name, "source": source,
                                          "aside": str(aside) if aside else None})  # fmt: skip
        return Restored(source, aside, report, pending)
    finally:
        if fd is not None:
            os.close(fd)


# --- the schedule --------------------------------------------------------------------------


def _copies(manifests: list[dict]) -> tuple[plan.Copy, ...]:
    copies = []
    for entry in manifests:
        try:
            created = datetime.fromisoformat(str(entry["created_at"]).replace("Z", "+00:00"))
        except (KeyError, ValueError):
            continue  # an unreadable manifest is never pruned by rule
        copies.append(plan.Copy(entry["file"], created))
    return tuple(copies)


def _remote_copies(names: list[str]) -> tuple[plan.Copy, ...]:
    copies = []
    for manifest_name in names:
        name = manifest_name[: -len(MANIFEST_SUFFIX)]
        match = NAME_RE.match(name)
        if match:
            created = datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            copies.append(plan.Copy(name, created))
    return tuple(copies)


def snapshot(now: datetime, copies: tuple[plan.Copy, ...]) -> plan.Snapshot:
    return plan.Snapshot(
        now=now,
        interval=registry.get("backup.interval"),
        keep=registry.get("backup.keep"),
        keep_days=registry.get("backup.keep_days"),
        copies=copies,
    )


def prune_local(directory: Path, prunes: tuple[plan.Prune, ...]) -> list[str]:
    removed = []
    for prune in prunes:
        for path in (directory / prune.name, directory / (prune.name + MANIFEST_SUFFIX)):
            path.unlink(missing_ok=True)
        removed.append(prune.name)
    return removed


def scheduled(now: datetime) -> dict:
    """One round of the schedule: a copy if one is due (encrypted with backup.passphrase if
    set, uploaded to backup.remotes), then retention here and at each remote."""
    directory = backup_dir()
    decision = plan.decide(snapshot(now, _copies(list_backups(directory))))
    outcome: dict[str, Any] = {"took": None, "why": decision.why, "pruned": [], "errors": []}
    if decision.take:
        try:
            taken = take(actor="system:backup", passphrase=registry.get("backup.passphrase"),
                         directory=directory, now=now)  # fmt: skip
            outcome["took"] = taken.manifest["file"]
        except BackupError as exc:
            outcome["errors"].append(str(exc))
            return outcome
        for url in registry.get("backup.remotes"):
            try:
                upload(taken.path, url)
            except BackupError as exc:
                outcome["errors"].append(str(exc))
    prunes = plan.retention(snapshot(now, _copies(list_backups(directory))))
    outcome["pruned"] += prune_local(directory, prunes)
    for url in registry.get("backup.remotes"):
        try:
            target, s3 = remote.parse(url), s3_client()
            there = _remote_copies(remote.manifests(s3, target))
            gone = plan.retention(snapshot(now, there))
            remote.delete(s3, target, [n for p in gone for n in (p.name, p.name + MANIFEST_SUFFIX)])
            outcome["pruned"] += [f"{target.url}{p.name}" for p in gone]
        except remote.RemoteError as exc:
            outcome["errors"].append(str(exc))
    return outcome
