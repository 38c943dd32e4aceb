"""Fixtures for the controller side of the agent protocol: registry, hosts, runners, HTTP.

Nothing is autouse (tests/fleet/agent/ shares this directory's conftest): a module asks
for `registry_defaults` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import count

import httpx
import pytest

from fleet import actions
from fleet.models import Host
from runners.models import Pool, Runner

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
FACTS = {
    "platform": "linux/x64",
    "backends": ["process"],
    "capacity": 4,
    "cpus": 8.0,
    "memory_mb": 16000,
    "labels": {"zone": "a"},
    "version": "0.1.0",
    "disk_total_mb": 100_000,
    "disk_free_mb": 50_000,
}
_serial = count(1)


def join(name: str = "", *, now: datetime = T0, **facts) -> tuple[Host, str]:
    """A host joined through the actions, as an agent would: (host, agent token)."""
    name = name or f"host-{next(_serial)}"
    _, secret = actions.create_join_token(now=now, actor="user:test")
    return actions.join_host(join_token=secret, name=name, facts={**FACTS, **facts}, now=now)


def make_runner(host: Host | None, state: str = "provisioning", *, now: datetime = T0) -> Runner:
    """A runner row as the reconcile pass would write it (creating runners is its job)."""
    pool, _ = Pool.objects.get_or_create(
        name="zoomies-linux-x64", defaults={"backend": "process", "labels": ["self-hosted"]}
    )
    return Runner.objects.create(
        name=f"zoomies-linux-x64-{next(_serial)}",
        pool=pool,
        host=host,
        state=state,
        created_at=now,
        state_changed_at=now,
    )


@dataclass
class AgentApi:
    """An httpx client for /api/v1/agent/ on the live server, with the agent's bearer."""

    base: str
    token: str | None = None

    def _headers(self, token: str | None) -> dict:
        token = token if token is not None else self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def post(self, path: str, body=None, *, token: str | None = None, **kw) -> httpx.Response:
        return httpx.post(
            self.base + path, json=body, headers=self._headers(token), timeout=10, **kw
        )

    def get(self, path: str, *, token: str | None = None, timeout: float = 40) -> httpx.Response:
        return httpx.get(self.base + path, headers=self._headers(token), timeout=timeout)


@pytest.fixture
def agent_api(live_server) -> AgentApi:
    return AgentApi(base=live_server.url + "/api/v1/agent/")


def later(seconds: float = 0, *, minutes: float = 0, start: datetime = T0) -> datetime:
    return start + timedelta(seconds=seconds, minutes=minutes)
