"""/api/v1/backups for administrators (issue 11 item 8; BAK-02, BAK-06).

The API queues the backup for a worker and lists and verifies what the command and the
schedule wrote: one layout through one module. Which roles and scopes reach these routes is
proven route by route in tests/accounts/test_route_walk.py.
"""

from __future__ import annotations

from importlib import import_module

import pytest
from django.db import connection
from django_q.models import OrmQ

from tests.accounts.conftest import client_for, make_user, mint
from zoomies_site.backup import service
from zoomies_site.core import registry

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="takes SQLite copies"),
]


def run_queued() -> list:
    """Run the queued tasks as a django-q2 worker would: the payload's function and args."""
    results = []
    for row in OrmQ.objects.all():
        task = row.task
        module, _, name = task["func"].rpartition(".")
        results.append(getattr(import_module(module), name)(*task["args"]))
        row.delete()
    return results


@pytest.fixture
def admin_api():
    admin = make_user("ada", "admin")
    return client_for(token=mint(admin, ["admin"]))


def test_bak06_an_admin_takes_lists_and_verifies_backups_through_the_api(admin_api, monkeypatch):
    monkeypatch.setenv("ZOOMIES_BACKUP_PASSPHRASE", "the configured passphrase, long enough")
    registry.reload()
    answer = admin_api.post("/api/v1/backups", {}, format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["queued"] is True and answer.json()["encrypted"] is True
    assert service.list_backups() == [], "taken by a worker, not in the request"

    [result] = run_queued()
    assert result["ok"], result
    listed = admin_api.get("/api/v1/backups").json()["results"]
    assert [e["file"] for e in listed] == [result["file"]]
    assert listed[0]["encrypted"] and listed[0]["created_by"] == answer.wsgi_request.auth.actor
    assert listed[0]["created_by"].endswith("of user:ada")

    verified = admin_api.post(f"/api/v1/backups/{result['file']}/verify")
    assert verified.status_code == 200
    body = verified.json()
    assert body["ok"] and [c["check"] for c in body["checks"]] == [
        "checksum", "decrypts", "integrity", "migrations"
    ]  # fmt: skip

    # A copy damaged since is reported as such, still with a 200 and each check.
    path = service.backup_dir() / result["file"]
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    body = admin_api.post(f"/api/v1/backups/{result['file']}/verify").json()
    assert body["ok"] is False and body["checks"][0]["check"] == "checksum"


def test_the_api_answers_bad_input_with_a_4xx(admin_api):
    assert admin_api.post("/api/v1/backups/..%2F..%2Fetc%2Fpasswd/verify").status_code == 404
    assert admin_api.post("/api/v1/backups/zoomies-20990101T000000Z.sqlite3/verify").status_code \
        == 404  # fmt: skip
    answer = admin_api.post("/api/v1/backups", {"upload": True}, format="json")
    assert answer.status_code == 400 and "backup.remotes" in str(answer.json())
    answer = admin_api.post("/api/v1/backups", {"upload": "perhaps"}, format="json")
    assert answer.status_code == 400
    assert not OrmQ.objects.exists()


def test_an_operator_may_not_take_or_list_backups():
    operator = client_for(make_user("otto", "operator"))
    assert operator.get("/api/v1/backups").status_code == 403
    assert operator.post("/api/v1/backups", {}, format="json").status_code == 403
    assert not OrmQ.objects.exists()
