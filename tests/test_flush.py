"""The flush after each transactional test (tests/conftest.py `_postgres_flush_by_delete`): on
PostgreSQL DELETEs in place of Django's one TRUNCATE, and on either database every table
is left empty, rows that reference one another included; on PostgreSQL the sequences are
left as they were, as Django's TRUNCATE without RESTART IDENTITY leaves them."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connection

from fleet.models import AgentTask, Host
from fleet.states import TaskKind
from tests.fleet.conftest import T0, join, make_runner

pytestmark = pytest.mark.django_db(transaction=True)


def every_row_count() -> dict[str, int]:
    return {
        model._meta.label: model._base_manager.count()
        for model in apps.get_models()
        if model._meta.managed and not model._meta.proxy
    }


def test_a_flush_empties_every_table_whatever_references_what():
    host, _ = join("flushed")
    runner = make_runner(host)
    AgentTask.objects.create(
        host=host, runner=runner, kind=TaskKind.CREATE_RUNNER, created_at=T0, lease_seconds=60
    )
    filled = {label for label, count in every_row_count().items() if count}
    assert {"fleet.Host", "runners.Runner", "fleet.AgentTask", "runners.Pool"} <= filled
    last_host = Host.objects.get().pk

    # As a transactional test's teardown calls it (django.test.TransactionTestCase), but
    # without the post_migrate signal, which writes the content types and permissions anew.
    call_command(
        "flush", interactive=False, verbosity=0, reset_sequences=False, inhibit_post_migrate=True
    )

    assert {label for label, count in every_row_count().items() if count} == set()
    again, _ = join("after-the-flush")
    if connection.vendor == "postgresql":
        assert again.pk > last_host, "the sequence was reset, as Django's TRUNCATE would not"


def test_on_postgresql_the_flush_deletes_rather_than_truncates():
    statements = connection.ops.sql_flush(no_style(), ["fleet_host", "runners_runner"])
    if connection.vendor != "postgresql":
        assert all("DELETE" in s for s in statements)  # SQLite's own flush deletes too
        return
    assert statements == [
        "SET CONSTRAINTS ALL DEFERRED",
        'DELETE FROM "fleet_host"',
        'DELETE FROM "runners_runner"',
    ]
    # A reset of the sequences stays Django's TRUNCATE.
    reset = connection.ops.sql_flush(no_style(), ["fleet_host"], reset_sequences=True)
    assert reset[0].startswith("TRUNCATE")
