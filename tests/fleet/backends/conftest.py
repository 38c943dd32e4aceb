"""Real container engines for the backend tests: a private dockerd and a private Podman
service, each started once per session in a directory of its own, with the test runner
image imported into it (built locally by docker/test-image/build.py: no registry).

Private, so a test may pause or stop the engine without touching anyone else's, and so
nothing a test leaves behind outlives the session. Skipped only when the engine's programs
are not installed (.ci/run installs them: apt-get install docker.io podman busybox-static);
an installed engine that does not come up is an error, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import pytest

from fleet.agent.backends.container import MANAGED_LABEL, ContainerBackend
from fleet.agent.backends.docker import DockerBackend
from fleet.agent.backends.podman import PodmanBackend
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "docker" / "test-image" / "build.py"
START_TIMEOUT = 90.0
# podman in a container-less, systemd-less sandbox: no rlimits it may not set, plain files.
PODMAN_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nevents_logger = "file"\n'


@dataclass
class Engine:
    """One running engine: its socket, its daemon's pid, and the test image in it."""

    kind: str  # "docker" or "podman"
    url: str
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    image: str = ""
    backends: list[ContainerBackend] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

    @property
    def backend_class(self) -> type[ContainerBackend]:
        return DockerBackend if self.kind == "docker" else PodmanBackend

    def backend(self, **options: object) -> ContainerBackend:
        options.setdefault("host", "test-host")
        options.setdefault("network_mode", "none")
        options.setdefault("pull_policy", "never")
        options.setdefault("request_timeout", 30.0)
        backend = self.backend_class(self.url, **options)  # type: ignore[arg-type]
        self.backends.append(backend)
        return backend

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, version="auto", timeout=30)

    def cli(self) -> list[str]:
        if self.kind == "docker":
            return [shutil.which("docker") or "docker", "-H", self.url]
        return [shutil.which("podman") or "podman", "--remote", "--url", self.url]

    def pause(self) -> None:
        """Freeze the daemon: it accepts connections and answers nothing (a hung engine)."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop_daemon(self) -> None:
        """Stop the daemon (a dockerd going away mid-burst); `start_daemon` brings it back
        over the same storage."""
        self.resume()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def start_daemon(self) -> None:
        self.process = _spawn(self.argv, self.log_path, self.env)
        _wait_answering(self.url, self.process, self.log_path)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def clean(self) -> None:
        """Remove every container: each test starts on an empty engine."""
        client = self.client()
        try:
            for container in client.containers.list(all=True, sparse=True):
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:  # 409: a removal already in progress
                        raise
            deadline = time.monotonic() + 30
            while client.containers.list(all=True, sparse=True):
                if time.monotonic() > deadline:
                    raise AssertionError("the engine did not remove its containers")
                time.sleep(0.1)
        finally:
            client.close()


def _spawn(argv: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait_answering(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            client = docker.DockerClient(base_url=url, version="auto", timeout=5)
            client.ping()
            client.close()
            return
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.2)
    process.kill()
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    pytest.fail(f"the engine at {url} did not come up ({last}); its log ends:\n{tail}")


def _stop(engine: Engine) -> None:
    engine.resume()  # a test that failed while it was paused must not hang the teardown
    for backend in engine.backends:
        client = backend._client
        if client is not None:
            client.close()
    with contextlib.suppress(Exception):  # the daemon is going away anyway
        engine.clean()
    engine.process.terminate()
    try:
        engine.process.wait(30)
    except subprocess.TimeoutExpired:
        engine.process.kill()
        engine.process.wait(10)


@pytest.fixture(scope="session")
def runner_image_tar(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    """The test runner image's rootfs tar, its content-derived tag, and its --change lines."""
    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed (apt-get install busybox-static)")
    out = tmp_path_factory.mktemp("image") / "rootfs.tar"
    subprocess.run([sys.executable, str(BUILD), "--out", str(out)], check=True)
    tag = subprocess.run(
        [sys.executable, str(BUILD), "--print-tag"], check=True, capture_output=True, text=True
    ).stdout.strip()
    changes = subprocess.run(
        [sys.executable, str(BUILD), "--print-changes"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return out, tag, changes


def _import_image(engine: Engine, image: tuple[Path, str, list[str]]) -> None:
    tar, tag, changes = image
    args = [*engine.cli(), "import"]
    for change in changes:
        args += ["--change", change]
    subprocess.run([*args, str(tar), tag], check=True, capture_output=True)
    engine.image = tag


def _kill_left_under(root: Path) -> list[int]:
    """Kill whatever the stopped engine left running that names its root on its command line:
    Podman's conmon monitors of exec sessions (the dind probe's `docker info`) outlived
    `podman system service` by about five minutes, after the run had ended and its root was
    gone. The run's leftover check (tests/leftovers.py) cannot see them, as Podman gives
    conmon an environment of its own. Answers the pids killed."""
    mark = (str(root).rstrip("/") + "/").encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        if mark in argv:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def _unmount_under(root: Path) -> None:
    """Lazily unmount whatever the engine left mounted under `root` (dockerd's netns file,
    Podman's overlay), deepest first, so the directory can be deleted."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(root).rstrip("/") + "/"
    points = [line.split()[4] for line in lines if len(line.split()) > 4]
    for point in sorted({p for p in points if p.startswith(prefix)}, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _short_dir(prefix: str) -> Path:
    # A unix socket path must stay under 108 bytes: pytest's tmp paths can be longer.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture(scope="session")
def docker_engine(runner_image_tar: tuple[Path, str, list[str]]) -> Iterator[Engine]:
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which("docker") is None:
        pytest.skip("dockerd is not installed (apt-get install docker.io)")
    root = _short_dir("zd-")
    url = f"unix://{root}/docker.sock"
    log_path = root / "dockerd.log"
    argv = [
        dockerd,
        "--host",
        url,
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "exec"),
        "--pidfile",
        str(root / "docker.pid"),
        # No bridge and no firewall: tests never make a private-range address.
        "--bridge=none",
        "--iptables=false",
        "--ip-masq=false",
    ]
    process = _spawn(argv, log_path, None)
    _wait_answering(url, process, log_path)
    engine = Engine("docker", url, root, process, log_path, argv=argv)
    try:
        _import_image(engine, runner_image_tar)
        yield engine
    finally:
        _stop(engine)
        _kill_left_under(root)
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def podman_engine(runner_image_tar: tuple[Path, str, list[str]]) -> Iterator[Engine]:
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("podman is not installed (apt-get install podman)")
    root = _short_dir("zp-")
    url = f"unix://{root}/podman.sock"
    conf = root / "containers.conf"
    conf.write_text(PODMAN_CONF)
    log_path = root / "podman.log"
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    argv = [
        podman,
        "--root",
        str(root / "storage"),
        "--runroot",
        str(root / "run"),
        "--tmpdir",
        str(root / "tmp"),
        "--cgroup-manager",
        "cgroupfs",
        "system",
        "service",
        "--time=0",
        url,
    ]
    process = _spawn(argv, log_path, env)
    _wait_answering(url, process, log_path)
    engine = Engine("podman", url, root, process, log_path, argv=argv, env=env)
    try:
        _import_image(engine, runner_image_tar)
        yield engine
    finally:
        _stop(engine)
        _kill_left_under(root)
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["docker", "podman"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """Each backend test runs once on Docker and once on Podman, on an empty engine."""
    running: Engine = request.getfixturevalue(f"{request.param}_engine")
    running.clean()
    yield running
    running.resume()
    if running.process.poll() is not None:  # a test stopped it and failed before restarting
        running.start_daemon()
    running.clean()
    for backend in running.backends:
        if backend._client is not None:
            backend._client.close()
    running.backends.clear()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """tests/waiting.py's wait, at an engine's pace (a container exiting)."""
    wait_until(predicate, timeout, what, every=0.05)


__all__ = ["MANAGED_LABEL", "Engine", "wait_for"]
