"""The embedded agent's host flag: looked for after the join, never fatal to the controller."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from fleet.agent.state import AgentState, StateStore
from fleet.models import Host, JoinToken
from tests.fleet.conftest import join
from zoomies_site import embedded_agent as embedded

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


def test_a_restart_on_a_new_internal_port_keeps_the_host_and_mints_no_join_token(
    tmp_path, monkeypatch
):
    """The kill drill's slow burst: a killed controller's web process still held the kept
    internal port, the restart chose another, and the embedded agent joined again as if new,
    failing its four busy runners (whose failures then held the pool's starts for 80 s).
    The state directory is the controller's own: its credentials are moved to the new port."""
    store = StateStore(tmp_path)
    store.save(AgentState(host_id=7, agent_token="zat_x", controller_url="http://127.0.0.1:40001"))
    seen: dict[str, dict[str, str]] = {}

    class Agent:
        def run(self, install_signals=True):
            return None

    def build_agent(**kwargs):
        seen["environ"] = kwargs["environ"]
        return Agent()

    monkeypatch.setattr(embedded, "build_agent", build_agent)
    monkeypatch.setattr(embedded, "flag_embedded_host", lambda *a, **k: True)
    embedded.start_embedded_agent(
        controller_url="http://127.0.0.1:40002", state_dir=tmp_path, capacity=2
    ).thread.join(5)
    assert seen["environ"] == {}  # no join token: the agent goes on as host 7
    assert not JoinToken.objects.exists()
    kept = store.load()
    assert (kept.host_id, kept.agent_token) == (7, "zat_x")
    assert kept.has_credentials_for("http://127.0.0.1:40002")


def test_an_agent_that_never_joined_is_given_a_join_token(tmp_path, monkeypatch):
    seen: dict[str, dict[str, str]] = {}

    class Agent:
        def run(self, install_signals=True):
            return None

    monkeypatch.setattr(
        embedded, "build_agent", lambda **kw: seen.setdefault("environ", kw["environ"]) and Agent()
    )
    monkeypatch.setattr(embedded, "flag_embedded_host", lambda *a, **k: True)
    embedded.start_embedded_agent(
        controller_url="http://127.0.0.1:40002", state_dir=tmp_path, capacity=2
    ).thread.join(5)
    assert seen["environ"]["ZOOMIES_JOIN_TOKEN"].startswith("zjt_")
    assert JoinToken.objects.count() == 1
