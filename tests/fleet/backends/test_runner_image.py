"""The runner image's wait for its pool's Docker daemon, on real engines (BACK-10, BACK-15).

The test image runs the production entrypoint (docker/runner/zoomies-entrypoint.sh). No
Docker daemon can run inside a container here, so each test runs it against a stand-in
`docker` client put first on the container's PATH: one that answers `info` three seconds
after it was first asked, one that hangs, one that answers at once. The stand-ins live in
an image made from the test image by a committed container, so nothing is pulled.
"""

from __future__ import annotations

import re

import docker.errors
import pytest

from fleet.agent.backends.base import RunnerSpec, WorkloadStatus
from tests.fleet.backends.conftest import Engine, wait_for

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
STANDINS = {
    # Answers once three seconds have passed since the first probe.
    "late": "[ -f /tmp/first ] || date +%s > /tmp/first\n"
    "[ $(( $(date +%s) - $(cat /tmp/first) )) -ge 3 ]\n",
    # Never answers and never returns: only the entrypoint's own bound ends a probe.
    "hang": "exec sleep 100000\n",
    "ready": "exit 0\n",
}
RUNNER = ["sh", "-c", "echo the runner starts"]
DAEMON = "unix:///run/zoomies-dind/docker.sock"


def standin_image(engine: Engine) -> str:
    """The test image plus /opt/standin/<kind>/docker for each stand-in, made once."""
    tag = f"zoomies-standin:{engine.image.rsplit(':', 1)[-1]}"
    client = engine.client()
    try:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        script = " && ".join(
            f"mkdir -p /opt/standin/{kind} && printf '#!/bin/sh\\n%s' '{body}' "
            f"> /opt/standin/{kind}/docker && chmod +x /opt/standin/{kind}/docker"
            for kind, body in STANDINS.items()
        )
        # Run as the image's command, so the committed image keeps the image's entrypoint.
        container = client.containers.create(
            engine.image, command=["sh", "-c", script], network_mode="none"
        )
        try:
            container.start()
            assert container.wait(timeout=60)["StatusCode"] == 0, container.logs()
            repository, _, version = tag.partition(":")
            container.commit(repository=repository, tag=version)
        finally:
            container.remove(force=True)
        return tag
    finally:
        client.close()


def run(
    engine: Engine, runner_id: int, path: str, command: list[str] = RUNNER, **env: str
) -> tuple[int | None, str]:
    """Create a runner from the stand-in image with `path` first on PATH; its exit code
    and output once it has exited."""
    backend = engine.backend()
    payload = {
        "runner_id": runner_id,
        "runner_name": f"zoomies-test-{runner_id}",
        "pool": "zoomies-dind",
        "backend": engine.kind,
        "image": standin_image(engine),
        "command": command,
        "env": {"PATH": path, **env},
    }
    backend.create(RunnerSpec.from_payload(payload))
    wait_for(
        lambda: backend.inspect(runner_id).status == WorkloadStatus.EXITED,
        90,
        "the runner's entrypoint to finish",
    )
    output = backend.logs(runner_id).decode(errors="replace")
    return backend.inspect(runner_id).exit_code, output


def test_back10_the_runner_starts_only_once_its_daemon_answers(engine: Engine):
    """BACK-10: with DOCKER_HOST set the image probes the daemon until it answers, and only
    then runs the runner (which asks the daemon itself: it would fail had it run sooner)."""
    code, output = run(
        engine, 41, f"/opt/standin/late:{BASE_PATH}",
        ["sh", "-c", "docker info && echo the runner starts"],
        DOCKER_HOST=DAEMON, ZOOMIES_DOCKER_WAIT="30",
    )  # fmt: skip
    assert code == 0, output
    assert "waiting up to 30 s" in output and "the runner starts" in output
    # The first probes were refused: the wait went on past them (whole seconds, so at least 2).
    answered = re.search(r"answered after (\d+) s", output)
    assert answered and int(answered.group(1)) >= 2, output


def test_back10_each_probe_is_bounded_so_a_hung_daemon_still_ends_in_69(engine: Engine):
    """BACK-10: every probe is bounded to 5 s, so a daemon that accepts and never answers
    still ends the wait; BACK-13: and the runner never starts."""
    code, output = run(
        engine, 42, f"/opt/standin/hang:{BASE_PATH}", DOCKER_HOST=DAEMON, ZOOMIES_DOCKER_WAIT="7"
    )
    assert code == 69, output
    assert "did not answer within 7 s" in output and "the runner starts" not in output


@pytest.mark.parametrize(
    ("wait", "code", "said"),
    [
        (None, 0, "waiting up to 120 s"),  # the image's own default
        ("3600", 0, "waiting up to 3600 s"),
        ("0120", 0, "waiting up to 120 s"),  # a leading zero is not octal
        ("3601", 78, "from 1 to 3600"),
        ("1.5", 78, "from 1 to 3600"),
    ],
)
def test_back10_the_wait_is_120_s_unless_told_and_takes_1_to_3600_s(
    engine: Engine, wait, code, said
):
    """BACK-10: ZOOMIES_DOCKER_WAIT takes whole seconds from 1 to 3600, 120 when unset."""
    env = {"DOCKER_HOST": DAEMON}
    if wait is not None:
        env["ZOOMIES_DOCKER_WAIT"] = wait
    got, output = run(engine, 43, f"/opt/standin/ready:{BASE_PATH}", **env)
    assert (got, said in output) == (code, True), output
    assert ("the runner starts" in output) == (code == 0)


def test_back15_an_image_without_a_docker_client_warns_and_runs_the_runner(engine: Engine):
    """BACK-15: no docker client on PATH is a warning in the log, not an exit."""
    code, output = run(engine, 44, "/bin", DOCKER_HOST=DAEMON, ZOOMIES_DOCKER_WAIT="30")
    assert code == 0, output
    assert "warning: this image has no docker client" in output
    assert "the runner starts" in output
