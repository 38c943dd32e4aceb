"""The installation stand-down is written by its own actions, with audit rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from accounts.models import AuditLog
from runners.actions import clear_standdown, stand_down_installation
from runners.actions import installations as actions
from runners.models import Installation

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_poll05_a_stand_down_is_recorded_with_its_reason_and_audited():
    inst = Installation.objects.create(github_id=7, account="acme")
    until = T0 + timedelta(minutes=30)
    stand_down_installation(
        inst, until=until, reason="rate limited " * 40, now=T0, actor="system:poller"
    )
    row = Installation.objects.get(pk=inst.pk)
    assert row.standdown_until == until and inst.standdown_until == until
    assert len(row.standdown_reason) == 300
    audit = AuditLog.objects.get(action="installation.stand_down")
    assert (audit.actor, audit.target_id) == ("system:poller", str(inst.pk))


@pytest.mark.django_db
def test_poll06_only_a_stand_down_that_ran_out_is_cleared_and_a_newer_one_stays():
    inst = Installation.objects.create(github_id=7, account="acme")
    until = T0 + timedelta(minutes=30)
    stand_down_installation(inst, until=until, reason="x", now=T0, actor="system:poller")
    assert not clear_standdown(inst, now=until - timedelta(seconds=1), actor="system:poller")
    stale = Installation.objects.get(pk=inst.pk)
    # Another sweep stands it down again meanwhile; the stale copy must not clear that one.
    newer = Installation.objects.get(pk=inst.pk)
    stand_down_installation(
        newer, until=until + timedelta(hours=1), reason="y", now=until, actor="system:reap"
    )
    assert not clear_standdown(stale, now=until, actor="system:poller")
    assert Installation.objects.get(pk=inst.pk).standdown_until == until + timedelta(hours=1)
    assert clear_standdown(newer, now=until + timedelta(hours=1), actor="system:poller")
    row = Installation.objects.get(pk=inst.pk)
    assert (row.standdown_until, row.standdown_reason) == (None, "")
    assert AuditLog.objects.filter(action="installation.stand_down_over").count() == 1


@pytest.mark.django_db
def test_issue22_item4_the_installation_writer_audits_refuses_and_never_resurrects():
    """runners.actions.installations, which the API, the command, GitHub's installation
    events and the sandbox now call (their own tests cover each path): a bad value is
    refused (the webhook path used to skip full_clean), each write has its audit row, and a
    redelivered `installation.created` does not bring back a removed installation."""
    made, created = actions.add_installation(
        github_id=9, account="acme", kind="org", repositories=["acme/app"], actor="t", now=T0
    )
    assert created and made.active
    actions.remove_installation(made, actor="system:webhooks", now=T0, why="uninstalled")
    # GitHub's `installation.created`, redelivered after the `deleted`: no resurrection.
    again, created = actions.add_installation(
        github_id=9, account="acme", kind="org", repositories=[], actor="system:webhooks",
        now=T0, only_new=True,
    )  # fmt: skip
    assert not created and not Installation.objects.get(pk=made.pk).active
    kept = actions.change_repositories(
        made, added=["acme/lib", "ACME/app"], removed=["acme/app"], actor="t", now=T0
    )
    assert kept == ["acme/lib", "ACME/app"]
    with pytest.raises(ValidationError):
        actions.add_installation(
            github_id=10, account="", kind="org", repositories=["not a repo"], actor="t", now=T0
        )
    assert list(AuditLog.objects.order_by("pk").values_list("action", flat=True)) == [
        "installation.create", "installation.remove", "installation.repositories",
    ]  # fmt: skip
