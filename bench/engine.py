"""A private Docker engine for the benchmarks, and what they time on it.

The engine is the backend tests' own (tests/fleet/backends/conftest.py): the same fixture
functions, called here outside pytest, build the test runner image locally
(docker/test-image/build.py, no registry), start a dockerd of its own in a temp dir and
import the image into it, and take it all down afterwards. So the benchmark and the tests
run one engine set-up, not two. A machine without dockerd (or busybox for the image) says
why in `NoEngine`, and the benchmark reports that instead of a figure.

`ContainerStarts` notes each container's start from the engine's event stream (the daemon's
own nanosecond stamp, on this machine's clock); `bare_runs` is the floor: `docker run` of
the same image, with the same network, measured in the same run.
"""

from __future__ import annotations

import inspect
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import pytest

from tests.fleet.backends import conftest as engines

Engine = engines.Engine
# The command of a bare run: the image's entrypoint, then the interpreter the fake runner
# needs, started and ended. A runner container does that much before it can register.
BARE_COMMAND = ["python3", "-c", "pass"]


class NoEngine(Exception):
    """No Docker engine could be started here; the message says why."""


class _TmpPathFactory:
    """What the image fixture asks of pytest's tmp_path_factory: a fresh directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))


@contextmanager
def docker_engine(tmp: Path) -> Iterator[Engine]:
    """The backend tests' private dockerd with the test runner image in it, for a `with`."""
    # The fixtures' own functions (pytest keeps each one as __wrapped__); calling them so
    # runs their set-up, and closing the engine's generator runs its tear-down.
    build_image = inspect.unwrap(engines.runner_image_tar)
    start_engine = inspect.unwrap(engines.docker_engine)
    try:
        image = build_image(_TmpPathFactory(tmp))
        running = start_engine(image)
        engine = next(running)
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:
        raise NoEngine(str(exc).strip().splitlines()[0]) from exc
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NoEngine(f"the engine could not be set up: {exc}") from exc
    try:
        yield engine
    finally:
        running.close()


@contextmanager
def engine_or_reason(tmp: Path) -> Iterator[tuple[Engine | None, str]]:
    """(the engine, "") for a `with`, or (None, why there is none)."""
    stack = ExitStack()
    try:
        engine = stack.enter_context(docker_engine(tmp))
    except NoEngine as exc:
        yield None, str(exc)
        return
    with stack:
        yield engine, ""


@dataclass
class ContainerStarts:
    """Every container start on the engine while it runs: (daemon's stamp, name)."""

    url: str
    starts: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._client = docker.APIClient(base_url=self.url, version="auto", timeout=30)
        self._stream = self._client.events(
            decode=True, filters={"type": "container", "event": "start"}
        )
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._stream:
                name = (event.get("Actor") or {}).get("Attributes", {}).get("name", "")
                with self._lock:
                    self.starts.append((event["timeNano"] / 1e9, name))
        except Exception:  # the stream was closed by stop()
            return

    def since(self, t0: float, prefix: str) -> list[float]:
        """Start stamps at or after `t0` of the containers whose name starts with `prefix`."""
        with self._lock:
            return sorted(t for t, name in self.starts if t >= t0 and name.startswith(prefix))

    def named(self, name: str) -> float | None:
        with self._lock:
            found = [t for t, n in self.starts if n == name]
        return found[0] if found else None

    def stop(self) -> None:
        self._stream.close()
        self._client.close()
        self._thread.join(timeout=5)


@dataclass
class BareRuns:
    """The floor: `docker run` of the runner image, from the command to its start and end."""

    started: list[float] = field(default_factory=list)
    whole: list[float] = field(default_factory=list)


def bare_runs(engine: Engine, starts: ContainerStarts, count: int, network: str) -> BareRuns:
    """`docker run --network NETWORK IMAGE python3 -c pass`, `count` times, one at a time:
    seconds to the container's start (the engine's event) and to the command's return (the
    container has exited). Each container is removed afterwards, outside the timing."""
    runs = BareRuns()
    for k in range(count):
        name = f"bench-floor-{k}"
        began = time.time()
        subprocess.run(
            [*engine.cli(), "run", "--name", name, "--network", network, engine.image,
             *BARE_COMMAND],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        runs.whole.append(time.time() - began)
        deadline = time.monotonic() + 10
        while (started := starts.named(name)) is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the event may trail the command's return
        if started is not None:
            runs.started.append(started - began)
        subprocess.run([*engine.cli(), "rm", "-f", name], capture_output=True, timeout=60)
    return runs
