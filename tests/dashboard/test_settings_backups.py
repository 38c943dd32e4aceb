"""Backups on the dashboard's Settings page (issue 11 item 8; BAK-06): an admin sees the
backups GET /api/v1/backups lists, takes one and verifies it, through the one module the API
and the commands use (zoomies_site/backup/service.py), each request audited. Nobody else
sees them or reaches the routes. Either engine: a SQLite copy or a pg_dump archive."""

from __future__ import annotations

import pytest
from django.test import Client
from django_q.models import OrmQ

from accounts.models import AuditLog
from tests.accounts.conftest import client_for
from tests.zoomies_site.test_backup_api import run_queued
from zoomies_site.backup import service
from zoomies_site.core import registry

# The copy is taken by its own connection (VACUUM INTO, pg_dump): the rows are committed.
pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def said(answer) -> str:
    return answer.content.decode()


def test_bak06_an_admin_takes_lists_and_verifies_a_backup_on_the_settings_page(cast, monkeypatch):
    monkeypatch.setenv("ZOOMIES_BACKUP_PASSPHRASE", "the configured passphrase, long enough")
    registry.reload()
    admin = signed_in(cast["admin"])
    page = said(admin.get("/settings"))
    assert 'id="backups"' in page and "No backups yet." in page
    assert "encrypted with <code>backup.passphrase</code>" in page

    answer = admin.post("/settings/backups", follow=True)
    assert answer.redirect_chain == [("/settings", 302)]
    assert "A backup is queued (encrypted with backup.passphrase)" in said(answer)
    assert service.list_backups() == [], "taken by a worker, not in the request"
    [task] = OrmQ.objects.all()
    assert task.task["args"] == ("user:ada", False)
    [result] = run_queued()
    assert result["ok"], result

    page = said(admin.get("/settings"))
    listed = client_for(cast["admin"]).get("/api/v1/backups").json()["results"]
    assert [b["file"] for b in listed] == [result["file"]]
    row = page.split(f'<tr data-file="{result["file"]}">')[1].split("</tr>")[0]
    assert "user:ada" in row and ">yes<" in row and "Verify" in row

    verified = said(admin.post(f"/settings/backups/{result['file']}/verify", follow=True))
    assert f"{result['file']} passed every check (checksum ok" in verified
    assert "decrypts ok" in verified and "migrations ok" in verified

    path = service.backup_dir() / result["file"]
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    damaged = said(admin.post(f"/settings/backups/{result['file']}/verify", follow=True))
    assert "failed its checks (checksum FAILED" in damaged and 'role="alert"' in damaged

    actions = AuditLog.objects.filter(action__startswith="backup.").order_by("pk")
    assert [(a.actor, a.action) for a in actions] == [
        ("user:ada", "backup.requested"), ("user:ada", "backup.created"),
        ("user:ada", "backup.verify"), ("user:ada", "backup.verify"),
    ]  # fmt: skip


def test_what_the_service_refuses_is_said_and_an_unknown_backup_is_a_404(cast):
    admin = signed_in(cast["admin"])
    answer = said(admin.post("/settings/backups", {"upload": "1"}, follow=True))
    assert "No backup was queued: backup.remotes names no remote to copy to" in answer
    assert "not encrypted" in said(admin.get("/settings"))
    assert admin.post("/settings/backups/zoomies-20990101T000000Z.sqlite3/verify").status_code \
        == 404  # fmt: skip
    assert admin.post("/settings/backups/..%2F..%2Fetc%2Fpasswd/verify").status_code == 404
    assert admin.get("/settings/backups").status_code == 405
    assert not OrmQ.objects.exists()


def test_only_an_admin_sees_backups_or_reaches_their_routes(cast):
    taken = service.take(actor="test")
    for role in ("operator", "viewer"):
        client = signed_in(cast[role])
        page = said(client.get("/settings"))
        assert 'id="backups"' not in page and taken.path.name not in page
        assert client.post("/settings/backups").status_code == 403
        assert client.post(f"/settings/backups/{taken.path.name}/verify").status_code == 403
    anonymous = Client().post("/settings/backups")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    assert not OrmQ.objects.exists()
    assert not AuditLog.objects.filter(action__in=["backup.requested", "backup.verify"]).exists()
