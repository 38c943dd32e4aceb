"""Backups to an S3-compatible remote, and the schedule (issue 11 items 6 and 7; BAK-04..06).

The remote is a real S3-compatible server on loopback: moto's server mode in a thread of
this process, spoken to over HTTP by boto3 exactly as a production remote is (FAKE-07).
"""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from moto.server import ThreadedMotoServer

from tests.e2e.harness import free_port
from tests.zoomies_site.test_backup import (
    _mutate_after_backup,
    assert_same,
    logical_content,
    populate,
    without_restore_audit,
)
from zoomies_site import actions as site_actions
from zoomies_site.backup import remote, service
from zoomies_site.backup.tasks import backup_task
from zoomies_site.core import registry
from zoomies_site.ticker import default_ticker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="restores SQLite's file"),
]
KEYS = {"aws_access_key_id": "zoomies-test", "aws_secret_access_key": "zoomies-test-secret"}


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on 127.0.0.1 (never another address), for this module."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_server, monkeypatch, request):
    """A fresh bucket, and the registry pointed at the server with its keys."""
    name = f"zoomies-{request.node.name[:30].replace('_', '-').lower()}"
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", **KEYS)
    s3.create_bucket(Bucket=name)
    monkeypatch.setenv("ZOOMIES_BACKUP_S3_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("ZOOMIES_BACKUP_S3_ACCESS_KEY_ID", KEYS["aws_access_key_id"])
    monkeypatch.setenv("ZOOMIES_BACKUP_S3_SECRET_ACCESS_KEY", KEYS["aws_secret_access_key"])
    registry.reload()
    yield s3, name
    registry.reload()


def keys_in(s3, bucket_name: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket_name).get("Contents", []))


def test_bak04_fake07_round_trip_backup_verify_encrypt_upload_download_restore(bucket, tmp_path):
    """Issue 11's acceptance, BAK-01..05, FAKE-07: backup, verify, encrypt, upload to the
    S3-compatible server, download and restore; every table's rows come back identical."""
    s3, name = bucket
    populate()
    expected = logical_content()
    passphrase = tmp_path / "passphrase"
    passphrase.write_text("a long enough passphrase for the test\n")

    out = io.StringIO()
    call_command("backup", "--encrypt", "--passphrase-file", str(passphrase),
                 "--remote", f"s3://{name}/zoomies/prod", stdout=out)  # fmt: skip
    local = next(service.backup_dir().glob("zoomies-*.sqlite3.enc"))
    assert f"copied to s3://{name}/zoomies/prod" in out.getvalue()
    call_command("backup", "verify", local.name, "--passphrase-file", str(passphrase),
                 stdout=(out := io.StringIO()))  # fmt: skip
    assert f"{local.name} verified" in out.getvalue()
    assert keys_in(s3, name) == [
        f"zoomies/prod/{local.name}", f"zoomies/prod/{local.name}.manifest.json"
    ]  # fmt: skip
    stored = s3.get_object(Bucket=name, Key=f"zoomies/prod/{local.name}")["Body"].read()
    assert stored == local.read_bytes()

    call_command("backup", "list", "--remote", f"s3://{name}/zoomies/prod",
                 stdout=(out := io.StringIO()))  # fmt: skip
    assert out.getvalue().startswith(f"s3://{name}/zoomies/prod/{local.name}  ")
    [listed] = service.list_remote(f"s3://{name}/zoomies/prod")
    assert listed == {**service.read_manifest(local), "error": None,
                      "url": f"s3://{name}/zoomies/prod/{local.name}"}  # fmt: skip

    # The local copy is gone (a lost disk); the restore fetches it from the remote.
    local.unlink()
    local.with_name(local.name + ".manifest.json").unlink()
    _mutate_after_backup()
    assert logical_content() != expected
    call_command("restore", f"s3://{name}/zoomies/prod/{local.name}",
                 "--passphrase-file", str(passphrase), stdout=(out := io.StringIO()))  # fmt: skip
    assert f"restored {local.name}" in out.getvalue()
    assert_same(without_restore_audit(logical_content()), expected)
    aside = out.getvalue().split("kept at ")[1].split()[0]

    Path(aside).unlink()


def test_bak04_a_remote_that_refuses_is_a_clear_error(bucket, monkeypatch):
    """BAK-04: a missing bucket or object, or a URL that is no remote: each a sentence."""
    s3, name = bucket
    populate()
    with pytest.raises(service.BackupError, match="NoSuchBucket"):
        service.take(actor="test", remotes=["s3://no-such-bucket/x"])
    with pytest.raises(service.BackupError, match="names no backup"):
        service.restore("s3://bucket-only", actor="test")
    with pytest.raises(service.BackupError, match="NoSuchKey|404|Not Found"):
        service.restore(f"s3://{name}/zoomies-20990101T000000Z.sqlite3", actor="test")
    with pytest.raises(remote.RemoteError, match="not a remote"):
        remote.parse("https://example.invalid/bucket")


def test_bak06_scheduled_backups_follow_the_interval_and_retention_here_and_remote(bucket):
    """BAK-06: the scheduled copies write the layout the command reads, are due from the
    newest copy's age, go to backup.remotes, and retention keeps the newest backup.keep at
    both ends."""
    s3, name = bucket
    populate()
    for key, value in {"backup.interval": "1h", "backup.keep": "2",
                       "backup.remotes": [f"s3://{name}/sched"]}.items():  # fmt: skip
        site_actions.set_setting(key, value, actor="test")
    registry.reload()
    t0 = timezone.now()
    first = service.scheduled(t0)
    assert first["took"] and first["why"] == "there is no backup yet" and not first["errors"]
    assert service.scheduled(t0 + timedelta(minutes=30))["took"] is None
    took = [first["took"]]
    for hours in (1, 2, 3):
        outcome = service.scheduled(t0 + timedelta(hours=hours, seconds=1))
        assert outcome["took"], outcome
        took.append(outcome["took"])
    local = [e["file"] for e in service.list_backups()]
    assert local == [took[3], took[2]], "the newest two are kept"
    assert keys_in(s3, name) == sorted(
        f"sched/{f}{suffix}" for f in took[2:] for suffix in ("", ".manifest.json")
    )
    # What the schedule wrote, the command reads.
    out = io.StringIO()
    call_command("backup", "verify", took[3], stdout=out)
    assert "verified" in out.getvalue()


def test_bak06_the_ticker_enqueues_the_scheduled_backup_only_when_it_is_set(monkeypatch):
    """BAK-06: the controller's ticker runs the schedule through django-q2."""
    queued = []
    monkeypatch.setattr("zoomies_site.ticker.enqueue", lambda func, *a: queued.append(func))
    ticker = default_ticker(timezone.now())
    backup = [job for job in ticker.jobs if job.name == "backup"][0]
    backup.run(timezone.now())
    assert queued == []
    monkeypatch.setenv("ZOOMIES_BACKUP_INTERVAL", "6h")
    registry.reload()
    backup.run(timezone.now())
    assert queued == ["zoomies_site.backup.tasks.backup_task"]

    outcome = backup_task()
    assert outcome["took"] and service.verify(outcome["took"]).ok
    assert backup_task()["took"] is None, "not due again within the interval"
