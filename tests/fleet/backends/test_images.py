"""The controller and agent images (docker/controller, docker/agent), built and run on the
private dockerd (issue 26 item 3).

The engine reaches no registry, so the Dockerfiles' `BASE` is a Debian bookworm made here by
debootstrap from Debian's mirror (its python3 is 3.11, as python:3.11-slim-bookworm's) and
imported; the builds reach PyPI over the host's network. The base takes minutes, so its tar
is kept between sessions under BASE_CACHE, keyed by the debootstrap command that made it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fleet.backends.conftest import Engine
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DEBOOTSTRAP_ARGS = [
    "--variant=minbase",
    "--include=python3,python3-venv,python3-pip,ca-certificates,curl",
    "bookworm",
]
MIRROR = "http://deb.debian.org/debian"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BASE_CACHE = Path(os.environ.get("ZOOMIES_IMAGE_BASE_CACHE", "/tmp/zoomies-image-base"))
# The images' user (docker/*/Dockerfile) and the controller's data directory, the volume.
IMAGE_UID = "10001"
DATA_DIR = "/var/lib/zoomies"
BUILD_TIMEOUT = 900
# What tests/fleet/backends/conftest.py's docker_engine runs, and the package with each.
ENGINE_TOOLS = {"dockerd": "docker.io", "docker": "docker.io", "busybox": "busybox-static"}
HEALTHY_TIMEOUT = 180.0


def base_tar() -> Path:
    """The debootstrapped bookworm's rootfs tar, made once per cache key (under a lock, so
    two sessions never debootstrap the same base at once)."""
    for tool in ("debootstrap", "tar"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (apt-get install debootstrap): no image base")
    if os.geteuid() != 0:
        pytest.fail("debootstrap needs root to make the images' base")
    key = hashlib.sha256(json.dumps([*DEBOOTSTRAP_ARGS, MIRROR]).encode()).hexdigest()[:16]
    BASE_CACHE.mkdir(parents=True, exist_ok=True)
    tar = BASE_CACHE / f"bookworm-{key}.tar"
    with open(BASE_CACHE / f"bookworm-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tar.exists():
            return tar
        work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=BASE_CACHE))
        try:
            rootfs = work / "rootfs"
            done = subprocess.run(
                ["debootstrap", *DEBOOTSTRAP_ARGS, str(rootfs), MIRROR],
                capture_output=True,
                text=True,
                timeout=1200,
            )
            if done.returncode != 0:
                pytest.fail(f"debootstrap failed:\n{(done.stdout + done.stderr)[-3000:]}")
            shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            partial = work / "rootfs.tar"
            subprocess.run(
                ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."],
                check=True,
            )
            partial.rename(tar)  # whole or absent: a killed session leaves no half tar
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tar


def trusting_base(engine: Engine, tar: Path) -> str:
    """The imported base plus this host's CA bundle, which pip is told to use: the builds'
    HTTPS may pass a proxy that this host trusts and Debian does not. Test-only, so the
    Dockerfiles stay what an operator builds on python:3.11-slim-bookworm."""
    imported = f"zoomies-test-base:{tar.stem.rsplit('-', 1)[-1]}"
    if not docker(engine, "images", "-q", imported):
        docker(engine, "import", "--change", f"ENV PATH={BASE_PATH}", str(tar), imported)
    bundle = Path(os.environ.get("SSL_CERT_FILE") or HOST_CA_BUNDLE).read_bytes()
    trusting = f"{imported}-ca-{hashlib.sha256(bundle).hexdigest()[:12]}"
    if docker(engine, "images", "-q", trusting):
        return trusting
    with tempfile.TemporaryDirectory() as context:
        Path(context, "ca-certificates.crt").write_bytes(bundle)
        Path(context, "Dockerfile").write_text(
            f"FROM {imported}\n"
            f"COPY ca-certificates.crt {HOST_CA_BUNDLE}\n"
            f"ENV PIP_CERT={HOST_CA_BUNDLE}\n"
        )
        docker(engine, "build", "-t", trusting, context)
    return trusting


def docker(engine: Engine, *args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        [*engine.cli(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        # The classic builder: it honours `--network host` for RUN steps with no buildx.
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def images(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, str, str]]:
    """The engine and the controller and agent images built on it; every container, volume
    and image the test made is removed afterwards (the base's tar stays, as the cache)."""
    tar = base_tar()
    # Failed here, not skipped as docker_engine would: an image test that never runs is a gap.
    for tool, package in ENGINE_TOOLS.items():
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (apt-get install {package}): no engine")
    engine: Engine = request.getfixturevalue("docker_engine")
    engine.clean()
    base = trusting_base(engine, tar)
    suffix = uuid.uuid4().hex[:8]
    built = {kind: f"zoomies-{kind}:test-{suffix}" for kind in ("controller", "agent")}
    try:
        for kind, tag in built.items():
            docker(engine, "build", "--network", "host", "--build-arg", f"BASE={base}",
                   "-f", str(ROOT / "docker" / kind / "Dockerfile"), "-t", tag, str(ROOT),
                   timeout=BUILD_TIMEOUT)  # fmt: skip
        yield engine, built["controller"], built["agent"]
    finally:
        engine.clean()
        for volume in docker(engine, "volume", "ls", "-q", "--filter", f"name={suffix}").split():
            docker(engine, "volume", "rm", "-f", volume, check=False)
        docker(engine, "rmi", "-f", *built.values(), check=False)
        docker(engine, "image", "prune", "-f", check=False)  # the builds' wheel stages


def zoomies(engine: Engine, container: str, *args: str) -> str:
    """A management command in the running controller; the secret it prints last."""
    return docker(engine, "exec", container, "zoomies", *args).splitlines()[-1]


def inspect(engine: Engine, name: str) -> dict:
    return json.loads(docker(engine, "inspect", name))[0]


def test_the_controller_image_serves_healthz_and_an_agent_image_joins_it(images) -> None:
    engine, controller_image, agent_image = images
    suffix = controller_image.rsplit("-", 1)[-1]
    port = free_port()
    volume = f"zoomies-data-{suffix}"
    controller = f"zoomies-controller-{suffix}"
    base_url = f"http://127.0.0.1:{port}"
    # Built with its static files and without a key: a key in the image would be everyone's.
    listing = docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "ls",
                     controller_image, "-A", DATA_DIR)  # fmt: skip
    assert listing.split() == ["static"]
    docker(engine, "run", "-d", "--name", controller, "--network", "host",
           "-v", f"{volume}:{DATA_DIR}", "-e", f"ZOOMIES_SERVER_BIND=0.0.0.0:{port}",
           "--health-interval", "2s", "--health-start-period", "120s",
           controller_image)  # fmt: skip

    def health() -> bool:
        state = inspect(engine, controller)["State"]
        if not state["Running"]:
            logs = docker(engine, "logs", controller, check=False)
            raise AssertionError(f"the controller exited {state['ExitCode']}:\n{logs[-3000:]}")
        return state["Health"]["Status"] == "healthy"

    try:
        wait_until(health, HEALTHY_TIMEOUT, "the controller's HEALTHCHECK to pass", every=1)
    except AssertionError:
        print(docker(engine, "logs", controller, check=False)[-3000:])
        raise
    assert httpx.get(f"{base_url}/healthz", timeout=10).status_code == 200

    # Not root, and its data (the SQLite file) in the named volume.
    assert docker(engine, "exec", controller, "id", "-u") == IMAGE_UID
    details = inspect(engine, controller)
    assert details["Config"]["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
    mounts = {m["Destination"]: m for m in details["Mounts"]}
    assert mounts[DATA_DIR]["Type"] == "volume" and mounts[DATA_DIR]["Name"] == volume
    docker(engine, "exec", controller, "test", "-s", f"{DATA_DIR}/zoomies.db")

    api_token = zoomies(engine, controller, "create_token", "--user", "images", "--create-user",
                        "--scope", "fleet:read")  # fmt: skip
    join_token = zoomies(engine, controller, "create_join_token")
    host_name = f"images-{suffix}"
    agent = f"zoomies-agent-{suffix}"
    docker(engine, "run", "-d", "--name", agent, "--network", "host",
           "-v", f"zoomies-agent-{suffix}:{DATA_DIR}", "-e", f"ZOOMIES_JOIN_TOKEN={join_token}",
           agent_image, "--controller", base_url, "--name", host_name)  # fmt: skip

    def host_listed() -> bool:
        if not inspect(engine, agent)["State"]["Running"]:
            logs = docker(engine, "logs", agent, check=False)
            raise AssertionError(f"the agent exited:\n{logs[-3000:]}")
        answer = httpx.get(
            f"{base_url}/api/v1/hosts",
            headers={"Authorization": f"Bearer {api_token}"},
            timeout=10,
        )
        answer.raise_for_status()
        body = answer.json()
        rows = body["results"] if isinstance(body, dict) else body
        return any(row["name"] == host_name for row in rows)

    wait_until(host_listed, 60, "the agent's host in /api/v1/hosts", every=1)
    assert docker(engine, "exec", agent, "id", "-u") == IMAGE_UID
    with contextlib.suppress(AssertionError):
        docker(engine, "stop", "-t", "20", agent, controller, timeout=60)
