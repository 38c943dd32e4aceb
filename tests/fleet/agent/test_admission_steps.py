"""What the host's one create slot covers inside a container create (AGENT-03, AGENT-04).

The agent runs the real Docker backend over an in-memory Docker API that writes every call
into one log, beside the moments the agent takes and gives back its slot; the backend's
clock is moved by the probe's own pauses, so a two-minute probe bound costs no real time.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import docker.errors
import pytest

from fleet.agent.agent import Agent
from fleet.agent.backends import container
from fleet.agent.backends.container import DIND_PROBE
from fleet.agent.backends.docker import DockerBackend

CMD = ["true"]
RUNNER_IMAGE = "example/runner:1"
DIND_IMAGE = "example/dind:1"
TAKEN, GIVEN_BACK = ("slot", "taken"), ("slot", "given back")


class FakeContainer:
    def __init__(self, engine: FakeDockerEngine, name: str) -> None:
        self.engine = engine
        self.id = name

    def start(self) -> None:
        self.engine.start(self.id)


class FakeContainers:
    """`client.containers` (the one high-level call a create makes), and, called, the
    low-level `api.containers` listing (nothing is left to list in these tests)."""

    def __init__(self, engine: FakeDockerEngine) -> None:
        self.engine = engine

    def __call__(self, **_: Any) -> list[dict[str, Any]]:
        return []

    def create(self, **kwargs: Any) -> FakeContainer:
        self.engine.note("create", kwargs["name"])
        self.engine.containers_made[kwargs["name"]] = kwargs
        return FakeContainer(self.engine, kwargs["name"])


class FakeDockerEngine:
    """The docker SDK client (and its `.api`) as far as a create, its probe and its clean-up
    go: images are missing until pulled; each sidecar answers the probes in `answers`
    (exit codes, the last repeated); a container named in `failing_starts` fails to start,
    and one in `slow_removals` takes that many (real) seconds to remove."""

    def __init__(self) -> None:
        self.api = self
        self.containers = FakeContainers(self)
        self.lock = threading.Lock()
        self.log: list[tuple[str, str]] = []
        self.images: set[str] = set()
        self.containers_made: dict[str, dict[str, Any]] = {}
        self.volumes: set[str] = set()
        self.answers: list[int] = [0]
        self.failing_starts: set[str] = set()
        self.slow_removals: dict[str, float] = {}
        self.probe_commands: list[list[str]] = []
        self._execs: dict[str, str] = {}

    def note(self, call: str, target: str) -> None:
        with self.lock:
            self.log.append((call, target))

    # -- the host ---------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {"NCPU": 4, "MemTotal": 8 << 30, "Architecture": "x86_64"}

    def close(self) -> None:
        pass

    # -- images -----------------------------------------------------------------------

    def inspect_image(self, image: str) -> dict[str, Any]:
        self.note("inspect_image", image)
        if image not in self.images:
            raise docker.errors.ImageNotFound(f"no such image: {image}")
        return {"Id": image}

    def pull(self, repository: str, tag: str | None = None, **_: Any) -> Iterator[dict[str, str]]:
        image = f"{repository}:{tag}"
        self.note("pull", image)
        self.images.add(image)
        return iter([{"status": f"Downloaded newer image for {image}"}])

    # -- containers and volumes -------------------------------------------------------

    def inspect_container(self, ref: str) -> dict[str, Any]:
        self.note("inspect_container", ref)
        raise docker.errors.NotFound(f"no such container: {ref}")

    def create_volume(self, name: str, **_: Any) -> dict[str, str]:
        self.note("create_volume", name)
        self.volumes.add(name)
        return {"Name": name}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def create_container(self, image: str, *, name: str, **kwargs: Any) -> dict[str, str]:
        self.note("create_container", name)
        self.containers_made[name] = {"image": image, **kwargs}
        return {"Id": name}

    def start(self, ref: str) -> None:
        self.note("start", ref)
        if ref in self.failing_starts:
            raise docker.errors.APIError(
                "500 Server Error", explanation=f"cannot start {ref}: exec format error"
            )

    def exec_create(self, ref: str, cmd: list[str], **_: Any) -> dict[str, str]:
        self.probe_commands.append(list(cmd))
        exec_id = f"exec-{len(self.probe_commands)}"
        self._execs[exec_id] = ref
        return {"Id": exec_id}

    def exec_start(self, exec_id: str) -> bytes:
        return b""

    def exec_inspect(self, exec_id: str) -> dict[str, int]:
        code = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        self.note("docker info", f"{self._execs[exec_id]} -> {code}")
        return {"ExitCode": code}

    def remove_container(self, ref: str, **_: Any) -> None:
        self.note("remove_container", ref)
        time.sleep(self.slow_removals.get(ref, 0.0))
        if self.containers_made.pop(ref, None) is None:
            raise docker.errors.NotFound(f"no such container: {ref}")

    def remove_volume(self, name: str, **_: Any) -> None:
        self.note("remove_volume", name)
        if name not in self.volumes:
            raise docker.errors.NotFound(f"no such volume: {name}")
        self.volumes.discard(name)


class MovedTime:
    """`time` as the container backend sees it: the probe's pauses move it, instantly."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def moved_time(monkeypatch: pytest.MonkeyPatch) -> MovedTime:
    moved = MovedTime()
    monkeypatch.setattr(
        container, "time", types.SimpleNamespace(monotonic=moved.monotonic, sleep=moved.sleep)
    )
    return moved


@pytest.fixture
def engine() -> FakeDockerEngine:
    return FakeDockerEngine()


@pytest.fixture
def docker_agent(
    make_agent: Callable[..., Agent], engine: FakeDockerEngine, moved_time: MovedTime
) -> Agent:
    """An agent with the Docker backend over `engine`, its slot's moments in the engine's log."""
    backend = DockerBackend(host="test-host", dind_image=DIND_IMAGE, client_factory=lambda: engine)
    agent = make_agent(backend)
    agent.connect()
    slot = agent._admission
    acquire, release = slot.acquire, slot.release

    def taking(ticket: int, *args: Any, **kwargs: Any) -> bool:
        admitted = acquire(ticket, *args, **kwargs)
        if admitted:
            engine.note(*TAKEN)  # nobody else can take it before this is written
        return admitted

    def giving_back() -> None:
        engine.note(*GIVEN_BACK)
        release()

    slot.acquire = taking
    slot.release = giving_back
    return agent


def enqueue(controller: Any, runner_id: int, *, dind: bool) -> int:
    return controller.enqueue_create(
        runner_id, CMD, backend="docker", image=RUNNER_IMAGE, dind=dind
    )


def plain_create(runner_id: int) -> list[tuple[str, str]]:
    """The log of a create of a runner with no sidecar, its image already here."""
    name = f"zoomies-runner-{runner_id}"
    return [
        TAKEN,
        ("inspect_container", name),  # is there one already? (AGENT-11, AGENT-24)
        ("inspect_image", RUNNER_IMAGE),
        ("create", name),
        ("start", name),
        GIVEN_BACK,
    ]


def test_agent03_the_slot_covers_image_pulls_daemon_readiness_the_create_and_its_clean_up(
    docker_agent, engine, controller
):
    """AGENT-03: the host's one slot is held from the image preparation (both images), through
    the sidecar's daemon answering, the runner's create, to the clean-up of a create that
    failed: the create queued behind touches the engine only once all of it is done."""
    engine.answers = [1, 1, 0]
    engine.failing_starts = {"zoomies-runner-1"}
    # A clean-up left to finish after the slot was given back would let runner 2 in first.
    engine.slow_removals = {"zoomies-runner-1": 0.2}
    failing = enqueue(controller, 1, dind=True)
    behind = enqueue(controller, 2, dind=False)
    docker_agent.poll_once(wait=0)

    assert engine.log == [
        TAKEN,
        ("inspect_container", "zoomies-runner-1"),
        ("inspect_image", RUNNER_IMAGE),  # image preparation
        ("pull", RUNNER_IMAGE),
        ("inspect_image", DIND_IMAGE),
        ("pull", DIND_IMAGE),
        ("create_volume", "zoomies-dind-1"),  # the DinD daemon's readiness
        ("create_container", "zoomies-dind-1"),
        ("start", "zoomies-dind-1"),
        ("docker info", "zoomies-dind-1 -> 1"),
        ("docker info", "zoomies-dind-1 -> 1"),
        ("docker info", "zoomies-dind-1 -> 0"),
        ("create", "zoomies-runner-1"),  # the runner's creation
        ("start", "zoomies-runner-1"),
        ("remove_container", "zoomies-runner-1"),  # the clean-up after its failure
        ("remove_container", "zoomies-dind-1"),
        ("remove_volume", "zoomies-dind-1"),
        GIVEN_BACK,
        *plain_create(2),
    ]
    result = controller.result_of(failing)
    assert result["ok"] is False
    assert "while starting zoomies-runner-1: cannot start zoomies-runner-1" in result["error"]
    assert controller.result_of(behind)["ok"] is True
    assert set(engine.containers_made) == {"zoomies-runner-2"} and engine.volumes == set()


def test_agent04_a_dind_runner_is_created_only_once_its_sidecar_answers_docker_info(
    docker_agent, engine, controller
):
    """AGENT-04: a running sidecar is not enough: the runner is created only after a bounded
    `docker info` in the sidecar answered, and until then the slot stays held, so the next
    create waits behind it."""
    engine.answers = [1, 1, 1, 0]
    first = enqueue(controller, 1, dind=True)
    second = enqueue(controller, 2, dind=False)
    docker_agent.poll_once(wait=0)

    log = engine.log
    running = log.index(("start", "zoomies-dind-1"))
    created = log.index(("create", "zoomies-runner-1"))
    assert log[running + 1 : created] == [
        ("docker info", "zoomies-dind-1 -> 1"),
        ("docker info", "zoomies-dind-1 -> 1"),
        ("docker info", "zoomies-dind-1 -> 1"),
        ("docker info", "zoomies-dind-1 -> 0"),
    ]
    assert log[created + 1 :] == [("start", "zoomies-runner-1"), GIVEN_BACK, *plain_create(2)]
    assert log.count(TAKEN) == 2 and log.index(TAKEN, 1) > created
    assert engine.probe_commands == [DIND_PROBE] * 4  # each try bounded: `timeout 5`
    assert DIND_PROBE[:2] == ["timeout", "5"]
    runner = engine.containers_made["zoomies-runner-1"]
    assert runner["environment"]["DOCKER_HOST"] == "unix:///run/zoomies-dind/docker.sock"
    assert [controller.result_of(t)["ok"] for t in (first, second)] == [True, True]


def test_agent04_a_sidecar_that_never_answers_ends_at_the_bound_with_no_runner_made(
    docker_agent, engine, controller, moved_time
):
    """AGENT-04: the probe is bounded by the dind wait (120 s unless told): a sidecar whose
    daemon never answers means no runner container, the sidecar and its volume removed, and
    only then, the slot given back to the create behind it (AGENT-03)."""
    engine.answers = [1]
    silent = enqueue(controller, 1, dind=True)
    behind = enqueue(controller, 2, dind=False)
    docker_agent.poll_once(wait=0)

    log = engine.log
    probes = [entry for entry in log if entry[0] == "docker info"]
    assert probes == [("docker info", "zoomies-dind-1 -> 1")] * 240  # every 0.5 s for 120 s
    assert moved_time.now == 119.5
    assert ("create", "zoomies-runner-1") not in log
    ended = log.index(("remove_volume", "zoomies-dind-1"))
    assert log[ended - 1 :] == [
        ("remove_container", "zoomies-dind-1"),
        ("remove_volume", "zoomies-dind-1"),
        GIVEN_BACK,
        *plain_create(2),
    ]
    assert controller.result_of(silent)["error"] == (
        "runner 1's Docker daemon (zoomies-dind-1) did not answer `docker info` within 120 s, "
        "so the runner was not created; `docker logs zoomies-dind-1` says why"
    )
    assert controller.result_of(behind)["ok"] is True
    assert set(engine.containers_made) == {"zoomies-runner-2"} and engine.volumes == set()
