"""The agent driving the Docker and Podman backends on real engines (AGENT-16, AGENT-23).

The agent is the real one, talking to the fake controller of tests/fleet/agent over HTTP on
127.0.0.1; its clock is moved by hand across the grace periods, the containers are real.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet import protocol
from fleet.agent.agent import Agent
from fleet.agent.backends.base import RunnerSpec, WorkloadStatus
from fleet.agent.cli import add_arguments, agent_from_options
from fleet.agent.reconcile import ORPHAN_LISTING_EVERY
from tests.fleet.agent.fakes import JOIN_TOKEN, FakeClock, FakeController, serving
from tests.fleet.backends.conftest import Engine, wait_for

# Busy for a while (a job), then done: exits 0 by itself, or at once on SIGTERM.
BUSY = ["sh", "-c", "trap 'exit 0' TERM; i=0; while [ $i -lt 80 ]; do sleep 0.1; "
        "i=$((i+1)); done"]  # fmt: skip
IDLE = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.1; done"]


@pytest.fixture
def controller() -> Iterator[FakeController]:
    with serving(FakeController()) as fake:
        yield fake


def make_agent(engine: Engine, controller: FakeController, tmp_path: Path, clock: FakeClock):
    backend = engine.backend(slots=3)
    return Agent(
        controller.url,
        tmp_path / "state",
        tmp_path / "work",
        [backend],
        name="test-host",
        capacity=3,
        clock=clock,
        join_token=JOIN_TOKEN,
        sleep=lambda seconds: None,
    )


def create_payload(engine: Engine, runner_id: int, command: list[str]) -> dict:
    return {
        "runner_id": runner_id,
        "runner_name": f"zoomies-test-{runner_id}",
        "pool": "zoomies-linux-x64",
        "backend": engine.kind,
        "image": engine.image,
        "command": command,
        "env": {"ACTIONS_RUNNER_INPUT_JITCONFIG": f"jit-{runner_id}"},
    }


def test_agent23_a_restarted_agent_adopts_three_busy_runners_removes_none_and_they_finish(
    engine: Engine, controller: FakeController, tmp_path: Path
):
    """AGENT-23: three runners busy on a real engine; the agent stops and a new one starts
    over the same state: it adopts all three before any loop, a reconcile long past the
    orphan grace removes none, and each one's end is reported when its job is done."""
    clock = FakeClock()
    first = make_agent(engine, controller, tmp_path, clock)
    first.connect()
    for rid in (101, 102, 103):
        controller.enqueue("create_runner", rid, create_payload(engine, rid, BUSY))
    first.poll_once(wait=1)
    assert all(controller.result_of(t)["ok"] for t in controller.tasks), controller.results
    first.reconcile_once()
    first.stop(grace=5)

    second = make_agent(engine, controller, tmp_path, clock)
    second.connect()
    assert sorted(second.adopt_existing()) == [101, 102, 103]
    second.poll_once(wait=0)  # one successful poll: the reaper may act from now on
    clock.advance(second.tunables.orphan_grace + 60)
    second.reconcile_once()
    backend = second.backends[engine.kind]
    assert sorted(w.runner_id for w in backend.list()) == [101, 102, 103]
    assert controller.reports_for(101)[-1]["state"] is None  # phases only: nothing ended

    wait_for(
        lambda: all(backend.inspect(r).status == WorkloadStatus.EXITED for r in (101, 102, 103)),
        30,
        "the three jobs to finish",
    )
    second.reconcile_once()
    ends = {r["runner_id"]: r for r in controller.reports if r["state"] == "removed"}
    assert sorted(ends) == [101, 102, 103]
    assert all(ends[r]["exit_code"] == 0 for r in ends)
    # Acknowledged and past the (zero) retention: the next pass deletes the containers.
    second.reconcile_once()
    assert backend.list() == []


def test_agent16_a_container_nobody_claims_is_reaped_after_the_grace_and_not_before(
    engine: Engine, controller: FakeController, tmp_path: Path
):
    """AGENT-16: a managed container the running agent has no record of (left by a previous
    agent after this one started) is removed 2 min after first seen, never before, and never
    before one successful task poll."""
    clock = FakeClock()
    agent = make_agent(engine, controller, tmp_path, clock)
    agent.connect()
    previous = engine.backend()  # the previous agent's backend, same host label
    previous.create(RunnerSpec.from_payload(create_payload(engine, 201, IDLE)))
    backend = agent.backends[engine.kind]
    grace = agent.tunables.orphan_grace
    assert grace == 120.0  # AGENT-16's two minutes, until the controller says otherwise

    agent.reconcile_once()  # first seen now
    clock.advance(grace + 1)
    agent.reconcile_once()
    assert backend.inspect(201).status == WorkloadStatus.RUNNING, "reaped before any task poll"
    agent.poll_once(wait=0)
    agent.reconcile_once()
    assert backend.inspect(201).status == WorkloadStatus.MISSING

    previous.create(RunnerSpec.from_payload(create_payload(engine, 202, IDLE)))
    clock.advance(ORPHAN_LISTING_EVERY)  # the listing for orphans is once an interval
    agent.reconcile_once()  # first seen now
    clock.advance(grace - 1)
    agent.reconcile_once()
    assert backend.inspect(202).status == WorkloadStatus.RUNNING, "reaped before the grace"
    clock.advance(1)
    agent.reconcile_once()
    assert backend.inspect(202).status == WorkloadStatus.MISSING
    assert controller.reports == []  # nobody's runner: nothing said about it


class CountingCreates:
    """Wraps a backend's create to count the attempts that reached the engine."""

    def __init__(self, backend) -> None:
        self.attempts: list[int] = []
        self._create = backend.create
        backend.create = self

    def __call__(self, spec):
        self.attempts.append(spec.runner_id)
        return self._create(spec)


def test_agent09_agent11_agent12_the_engine_stops_in_a_burst_of_ten_creates(
    engine: Engine, controller: FakeController, tmp_path: Path
):
    """The engine goes away after three of ten creates and comes back later. AGENT-11: the
    fourth create's inventory cannot tell whether its runner exists, so it asks three more
    times (2 + 5 + 10 s) and, AGENT-12, being a first delivery, fails out loud, never
    building a replacement; AGENT-09: that silence holds the next start 5 s; once the
    engine answers the starts resume and the success clears the hold. Ten tasks, nine
    attempts at the engine: no storm."""
    clock = FakeClock()
    agent = make_agent(engine, controller, tmp_path, clock)
    agent.connect()
    backend = agent.backends[engine.kind]
    counting = CountingCreates(backend)
    pauses: list[float] = []

    def pause(seconds: float) -> bool:
        pauses.append(seconds)
        clock.advance(seconds)
        if len(pauses) == 4:  # the engine comes back during the hold
            engine.start_daemon()
        return False

    agent._pause = pause
    original_create = counting._create

    def create_then_stop(spec):
        handle = original_create(spec)
        if len(counting.attempts) == 3:
            engine.stop_daemon()
        return handle

    counting._create = create_then_stop
    tasks = {
        rid: controller.enqueue("create_runner", rid, create_payload(engine, rid, IDLE))
        for rid in range(301, 311)
    }
    agent.poll_once(wait=1)

    results = {rid: controller.result_of(task) for rid, task in tasks.items()}
    assert [rid for rid, r in results.items() if not r["ok"]] == [304]
    assert "cannot tell whether runner 304's workload exists" in results[304]["error"]
    assert "did not answer" in results[304]["error"]
    assert pauses == [2.0, 5.0, 10.0, 5.0]
    assert counting.attempts == [301, 302, 303, *range(305, 311)]
    assert agent._start_hold.remaining() == 0
    assert sorted(w.runner_id for w in backend.list()) == [301, 302, 303, *range(305, 311)]


def test_back14_the_agent_reports_exit_69_as_a_sentence_naming_the_log(
    engine: Engine, controller: FakeController, tmp_path: Path
):
    """BACK-14: the end report of a runner whose Docker daemon never answered says so, and
    says where its log is; the runner fails with its exit code."""
    clock = FakeClock()
    agent = make_agent(engine, controller, tmp_path, clock)
    agent.connect()
    payload = create_payload(engine, 401, IDLE)
    payload.pop("command")  # the image's own entrypoint and command
    payload["env"] = {"DOCKER_HOST": "unix:///nowhere.sock", "ZOOMIES_DOCKER_WAIT": "1"}
    controller.enqueue("create_runner", 401, payload)
    agent.poll_once(wait=1)
    backend = agent.backends[engine.kind]
    wait_for(lambda: backend.inspect(401).status == WorkloadStatus.EXITED, 20, "exit 69")
    agent.reconcile_once()
    end = [r for r in controller.reports_for(401) if r["state"] == "failed"]
    assert len(end) == 1 and end[0]["exit_code"] == 69
    assert end[0]["message"].startswith("the runner's Docker daemon never answered")
    assert f"`{engine.kind} logs zoomies-runner-401` on test-host" in end[0]["message"]
    assert "did not answer within 1 s" in end[0]["output_tail"]


def test_back01_back03_an_agent_built_with_a_container_backend_offers_it_and_its_size(
    engine: Engine, tmp_path: Path
):
    """BACK-01: `--backend docker` / `--backend podman` next to the process backend; the
    host's size is the engine's answer (BACK-03), and a unset pool field is one slot's share
    of it (the container backend knows the agent's slots); BACK-03: which limits each
    backend can apply goes to the controller with the host's facts."""

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = vars(
        parser.parse_args(
            [
                "--controller",
                "http://127.0.0.1:9",
                "--state-dir",
                str(tmp_path / "state"),
                "--name",
                "host-b",
                "--capacity",
                "3",
                "--backend",
                "process",
                "--backend",
                engine.kind,
                f"--{engine.kind}-url",
                engine.url,
                "--pull-policy",
                "never",
                "--runner-network",
                "none",
                "--create-timeout",
                "42",
                "--dind-image",
                "docker:27-dind",
            ]
        )
    )
    agent = agent_from_options(options)
    assert list(agent.backends) == [engine.kind, "process"]
    backend = agent.backends[engine.kind]
    assert (backend.host, backend.slots, backend.pull_policy) == ("host-b", 3, "never")
    assert backend.dind_image == "docker:27-dind"  # AGENT-14: what a Docker pool prewarms
    assert (backend.network_mode, backend.create_timeout, backend.base_url) == (
        "none",
        42.0,
        engine.url,
    )
    info = agent.host_info()
    assert info["backends"] == [engine.kind, "process"]
    client = engine.client()
    try:
        machine = client.info()
    finally:
        client.close()
    assert info["cpus"] == float(machine["NCPU"]) and info["platform"] == "linux/x64"
    # BACK-03, BACK-05: each backend says which limits its engine can apply, as the engine
    # itself answers; the process backend applies none. The heartbeat's shape carries it.
    engine_can = [
        kind
        for kind, key in (("cpus", "CpuCfsQuota"), ("memory", "MemoryLimit"))
        if machine.get(key)
    ]
    assert engine_can, "these engines apply both limits: the test would prove nothing"
    assert info["backend_limits"] == {engine.kind: engine_can, "process": []}
    facts = protocol.HeartbeatRequest.from_json(info).facts
    assert facts.backend_limits == {engine.kind: tuple(engine_can), "process": ()}
    agent.client.close()


def test_agent13_agent10_a_create_hung_in_the_engine_ends_at_its_timeout_and_frees_the_slot(
    engine: Engine, controller: FakeController, tmp_path: Path
):
    """AGENT-13: the engine freezes during the first of two queued creates; that create ends
    at the create timeout, its runner fails with the sentence, and the slot goes to the next
    create, which starts once the engine answers again. AGENT-10: a timeout opens no hold."""
    clock = FakeClock()
    agent = make_agent(engine, controller, tmp_path, clock)
    agent.connect()
    backend = agent.backends[engine.kind]
    backend.create_timeout = 2.0
    counting = CountingCreates(backend)
    original_create = counting._create

    def freeze_the_first(spec):
        if spec.runner_id == 501:
            engine.pause()
            try:
                return original_create(spec)
            finally:
                engine.resume()
        return original_create(spec)

    counting._create = freeze_the_first
    first = controller.enqueue("create_runner", 501, create_payload(engine, 501, IDLE))
    second = controller.enqueue("create_runner", 502, create_payload(engine, 502, IDLE))
    agent.poll_once(wait=1)

    failed = controller.result_of(first)
    assert not failed["ok"] and "within the create timeout (2 s)" in failed["error"]
    assert controller.result_of(second)["ok"]
    assert counting.attempts == [501, 502]
    assert agent._start_hold.remaining() == 0
    assert backend.inspect(502).status == WorkloadStatus.RUNNING
    wait_for(
        lambda: backend.inspect(501).status == WorkloadStatus.MISSING,
        40,
        "what the abandoned create made to be removed",
    )
