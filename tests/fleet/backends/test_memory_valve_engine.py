"""The memory valve against a real Docker engine (issue 25's acceptance, HOST-27, HOST-28,
HOST-31): a container that allocates steadily past its 64 MB limit is raised before the
kernel kills it and finishes, its limit never going down; in observe mode the same workload
is OOM-killed and the valve's record says what it would have lent.

On Podman, whose compat API has no container update, a needed raise is reported refused."""

from __future__ import annotations

import time

import pytest

from fleet.agent.memory_valve import MemoryUse, MemoryValve
from fleet.protocol import MemoryRules, RunnerMemoryRule
from tests.fleet.backends.conftest import Engine
from tests.fleet.backends.test_container_backends import attrs, spec

# About 10 MB a second (a 1 MB string, then a tenth of a second), to 120 MB, then done.
CLIMB = ["awk", 'BEGIN { for (i = 0; i < 120; i++) { a[i] = sprintf("%1048576s", ""); '
         'system("sleep 0.1") } print "done"; exit 0 }']  # fmt: skip
RULES = MemoryRules(
    capacity_mb=1024, floor_mb=256, runners=(RunnerMemoryRule(51, guarantee_mb=64, ceiling_mb=256),)
)


@pytest.fixture
def docker(docker_engine: Engine):
    docker_engine.clean()
    yield docker_engine
    docker_engine.clean()
    for backend in docker_engine.backends:
        if backend._client is not None:
            backend._client.close()
    docker_engine.backends.clear()


def run_under_valve(engine: Engine, valve: MemoryValve) -> tuple[dict, list[int], list[str]]:
    """Create the climbing runner at 64 MB and step the valve until it exits (60 s at
    most); answers its final inspect, every limit the engine showed, and the valve's lines."""
    backend = engine.backend()
    backend.create(spec(engine, 51, command=CLIMB, memory_mb=64))
    limits: list[int] = []
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = attrs(engine, 51)
        limits.append(seen["HostConfig"]["Memory"] // (1024 * 1024))
        if not seen["State"]["Running"]:
            return seen, limits, lines
        lines += valve.step(time.monotonic(), [51], backend.memory_use, backend.raise_memory,
                            lambda: 16_000)  # fmt: skip
        time.sleep(0.2)
    raise AssertionError(f"the climbing runner never ended: {lines}")


def test_host27_host28_a_climbing_container_is_raised_in_time_and_finishes(docker: Engine):
    valve = MemoryValve(rules=RULES)
    final, limits, lines = run_under_valve(docker, valve)
    logs = docker.backend().logs(51).decode()
    assert not final["State"]["OOMKilled"] and final["State"]["ExitCode"] == 0, (lines, logs)
    assert "done" in logs
    assert limits[0] == 64 and limits[-1] > 64, limits
    assert limits == sorted(limits), f"a limit went down: {limits}"  # HOST-28
    assert limits[-1] <= 256  # the ceiling
    assert valve.loans() == {51: limits[-1] - 64}
    assert any("raised memory" in line for line in lines), lines


def test_host31_in_observe_mode_the_same_workload_is_killed_and_the_loan_recorded(
    docker: Engine,
):
    valve = MemoryValve(observe=True, rules=RULES)
    final, limits, lines = run_under_valve(docker, valve)
    assert final["State"]["OOMKilled"], final["State"]
    assert set(limits) == {64}, "observe mode changed the container"
    assert valve.loans()[51] > 0 and any("would raise" in line for line in lines), lines


def test_host27_on_podman_a_needed_raise_is_said_refused_and_the_limit_stands(podman_engine):
    """Podman's compat API has no container update: the valve reads the container's use, and
    a raise it needs is reported blocked with the engine's refusal, never half done."""
    podman_engine.clean()
    backend = podman_engine.backend()
    backend.create(spec(podman_engine, 52, command=["sleep", "30"], memory_mb=64))
    try:
        use = backend.memory_use(52)
        assert use is not None and use.limit_mb == 64
        valve = MemoryValve(rules=MemoryRules(
            capacity_mb=1024, floor_mb=256,
            runners=(RunnerMemoryRule(52, guarantee_mb=64, ceiling_mb=256),),
        ))  # fmt: skip
        lines = valve.step(0.0, [52], lambda _r: MemoryUse(60.0, 64), backend.raise_memory,
                           lambda: 16_000)  # fmt: skip
        assert "Podman cannot raise" in valve.blocked()[52] and "blocked" in lines[0]
        assert attrs(podman_engine, 52)["HostConfig"]["Memory"] == 64 * 1024 * 1024
    finally:
        backend.remove(52)
        podman_engine.clean()
