"""`manage.py add_installation`: the API's one writer and one validation (STYLE: one place
writes each state), so the command's row, its audit row and its errors match the API's."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from accounts.models import AuditLog
from runners.models import Installation


@pytest.mark.django_db
def test_the_command_records_the_installation_and_its_audit_row():
    call_command("add_installation", "--id", "41", "--account", "acme", "--repo", "acme/app")
    installation = Installation.objects.get(github_id=41)
    assert installation.repositories == ["acme/app"] and installation.active
    entry = AuditLog.objects.get(action="installation.create")
    assert entry.actor == "cli:add_installation"
    call_command("add_installation", "--id", "41", "--account", "acme", "--repo", "acme/web")
    assert Installation.objects.get(github_id=41).repositories == ["acme/web"]
    assert AuditLog.objects.filter(action="installation.update").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ["--id", str(2**63), "--account", "acme"],  # past a bigint: was an OverflowError
        ["--id", "0", "--account", "acme"],
        ["--id", "7", "--account", "a" * 201],
        ["--id", "7", "--account", "acme", "--repo", "no-slash"],
        ["--id", "7", "--account", "acme", "--repo", "acme/"],
    ],
    ids=["id-past-bigint", "id-zero", "long-account", "repo-without-owner", "repo-without-name"],
)
def test_bad_input_is_a_clear_error_and_records_nothing(args):
    with pytest.raises(CommandError):
        call_command("add_installation", *args)
    assert not Installation.objects.exists()
    assert not AuditLog.objects.filter(action__startswith="installation").exists()


@pytest.mark.django_db
def test_the_api_refuses_the_same_repository_names(token_for):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for['admin']}")
    answer = api.post(
        "/api/v1/installations",
        {"github_id": 7, "account": "acme", "repositories": ["no-slash"]},
        format="json",
    )
    assert answer.status_code == 400
    assert "owner/name" in str(answer.json()["repositories"])
