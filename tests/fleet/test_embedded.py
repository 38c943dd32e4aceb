"""The embedded agent's host flag: looked for after the join, never fatal to the controller."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from fleet import embedded
from fleet.models import Host
from tests.fleet.conftest import join

# The flag closes its thread's connection, as its own thread must: rows are committed for real.
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_locked_database_at_start_delays_the_flag_but_never_raises(monkeypatch):
    """A write lock held past SQLite's busy timeout while the controller started made this
    update raise, and the controller shut down (the held-write-lock drill, on a slow
    machine). Now each refused try is a warning and the next try flags the host."""
    host, _token = join("zoomies-box")
    real_filter = Host.objects.filter
    refusals = [OperationalError("database is locked")] * 2

    class Locked:
        def __init__(self, queryset):
            self.queryset = queryset

        def update(self, **fields):
            if refusals:
                raise refusals.pop()
            return self.queryset.update(**fields)

    monkeypatch.setattr(Host.objects, "filter", lambda **kw: Locked(real_filter(**kw)))
    pauses: list[float] = []
    assert embedded.flag_embedded_host("zoomies-box", lambda: True, pause=pauses.append)
    assert len(pauses) == 2 and not refusals
    host.refresh_from_db()
    assert host.embedded


def test_no_row_and_a_stopped_agent_is_no_flag_and_no_error():
    pauses: list[float] = []
    assert not embedded.flag_embedded_host("zoomies-none", lambda: False, pause=pauses.append)
    assert pauses == []
    assert not embedded.flag_embedded_host(
        "zoomies-none", lambda: True, tries=3, pause=pauses.append
    )
    assert len(pauses) == 3
