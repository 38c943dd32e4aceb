"""Fixtures: a fake controller on 127.0.0.1, a hand-moved clock, and agents to point at it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.agent.agent import Agent
from fleet.agent.backends.base import Backend
from fleet.agent.backends.process import ProcessBackend
from tests.fleet.agent.fakes import (
    JOIN_TOKEN,
    FakeClock,
    FakeController,
    serving,
)


@pytest.fixture
def controller() -> Iterator[FakeController]:
    with serving(FakeController()) as fake:
        yield fake


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "state", tmp_path / "work"


@pytest.fixture
def make_agent(
    controller: FakeController, clock: FakeClock, dirs: tuple[Path, Path]
) -> Iterator[Callable[..., Agent]]:
    """Builds agents over the same state and work dirs, as a restarted host would."""
    agents: list[Agent] = []
    backends: list[Backend] = []

    def build(backend: Backend | None = None, **kwargs: Any) -> Agent:
        state_dir, work_dir = dirs
        backend = backend or ProcessBackend(work_dir)
        backends.append(backend)
        options: dict[str, Any] = {
            "name": "test-host",
            "capacity": 2,
            "clock": clock,
            "join_token": JOIN_TOKEN,
            "sleep": lambda seconds: None,
        }
        options.update(kwargs)
        agent = Agent(controller.url, state_dir, work_dir, [backend], **options)
        agents.append(agent)
        return agent

    yield build
    for agent in agents:
        agent.request_stop()
        agent.wait_for_tasks(5)
    # Never leave a runner process behind a test.
    for backend in backends:
        with contextlib.suppress(Exception):
            for workload in backend.list():
                backend.remove(workload.runner_id)
