"""Runner logs end to end (LOG-01..04, LOG-06): browsers on the controller's own web server
(zoomies_site/server.py, daphne, in a child process over the test database), a real agent
with the process backend, and a runner that keeps printing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from accounts.actions import create_api_token, create_user
from fleet.agent.agent import Agent
from fleet.agent.backends.base import RunnerSpec
from fleet.agent.backends.process import ProcessBackend
from fleet.agent.client import ControllerClient
from fleet.models import AgentTask
from runners.models import Runner
from tests.conftest import child_database_env
from tests.e2e.harness import free_port, wait_for
from tests.fleet.conftest import join, make_runner

pytestmark = [pytest.mark.usefixtures("registry_defaults"), pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]
# A runner that keeps printing a numbered line every tenth of a second.
TALKER = (
    "import itertools, time\n"
    "for n in itertools.count():\n"
    "    print(f'line {n}', flush=True)\n"
    "    time.sleep(0.1)\n"
)


@dataclass(frozen=True)
class Server:
    url: str
    port: int
    pid: int


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:
    """`python -m zoomies_site.server` on the test database: the production web server."""
    port = free_port()
    env = {**os.environ, **child_database_env()}
    env["ZOOMIES_CONFIG_FILE"] = str(tmp_path / "absent-zoomies.yaml")
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "zoomies_site.server", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / "server.log").read_text()
        try:
            return httpx.get(url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, 60, "the web server")
        yield Server(url, port, process.pid)
    finally:
        process.terminate()
        process.wait(20)


def viewer_token(role: str = "viewer") -> str:
    user = create_user(username=f"v-{role}", role=role, password=None, actor="test")
    _token, secret = create_api_token(user=user, name="logs", scopes=["fleet:read"], actor="test")
    return secret


class Viewer:
    """One browser following a runner's log: the SSE events, read as they come."""

    def __init__(self, url: str, token: str) -> None:
        self.client = httpx.Client(timeout=httpx.Timeout(10, read=30))
        self.response = self.client.send(
            self.client.build_request("GET", url, headers={"Authorization": f"Bearer {token}"}),
            stream=True,
        )
        self._lines = self.response.iter_lines()

    def event(self) -> tuple[str, dict]:
        name = data = None
        for line in self._lines:
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif not line and name is not None:
                return name, data or {}
        raise AssertionError("the stream ended")

    def text_until(self, needle: str) -> str:
        seen = ""
        while needle not in seen:
            name, data = self.event()
            assert name == "output", (name, data)
            seen += data["text"]
        return seen

    def close(self) -> None:
        self.response.close()
        self.client.close()


def test_log01_02_03_04_two_viewers_share_one_agent_stream_and_leaving_sends_cancel(
    server, tmp_path
):
    """LOG-01: the first viewer's GET sends the runner's host one stream_logs task.
    LOG-03: the second viewer joins that stream (no second task). LOG-02: the agent follows
    the workload's output and both viewers get it as SSE events. LOG-04: once both have
    closed their connections the host is sent cancel_logs, and the agent stops reading."""
    host, agent_token = join("logs-host")
    runner = make_runner(host, "idle")
    backend = ProcessBackend(tmp_path / "work")
    backend.create(
        RunnerSpec(runner_id=runner.pk, runner_name=runner.name, pool="p", backend="process",
                   command=[sys.executable, "-c", TALKER])
    )  # fmt: skip
    client = ControllerClient(server.url, agent_token=agent_token)
    agent = Agent(
        server.url, tmp_path / "state", tmp_path / "work", [backend], "logs-host", 1, client=client
    )
    url = f"{server.url}/api/v1/runners/{runner.pk}/logs"
    token = viewer_token()
    first = second = None
    try:
        first = Viewer(url, token)
        assert first.response.status_code == 200
        assert first.response.headers["content-type"].startswith("text/event-stream")
        name, opened = first.event()
        assert (name, opened["shared"]) == ("stream", False)
        second = Viewer(url, token)
        assert second.event() == ("stream", {"stream_id": opened["stream_id"], "shared": True})
        (task,) = AgentTask.objects.filter(runner=runner, kind="stream_logs")
        assert task.payload == {"runner_id": runner.pk, "stream_id": opened["stream_id"]}
        assert task.max_attempts == 1  # a relay is never offered again

        agent.poll_once(wait=0)  # takes stream_logs, starts the relay, answers it
        assert agent._log_relay.active() == [opened["stream_id"]]
        task.refresh_from_db()
        assert task.state == "done"
        for viewer in (first, second):
            assert "line 0\nline 1\nline 2\n" in viewer.text_until("line 3\n")

        # One viewer leaving ends nothing: the other is still fed a second later, and the
        # one cancel_logs counted below is the last viewer's.
        first.close()
        name, data = second.event()
        assert name == "output", (name, data)
        later = int(data["text"].rstrip().rsplit("line ", 1)[1]) + 10
        second.text_until(f"line {later}\n")
        second.close()
        wait_for(
            lambda: AgentTask.objects.filter(runner=runner, kind="cancel_logs").exists(),
            15,
            "cancel_logs after the last viewer left",
        )
        (cancel,) = AgentTask.objects.filter(kind="cancel_logs")
        assert cancel.payload["stream_id"] == opened["stream_id"]
        agent.poll_once(wait=5)
        assert agent._log_relay.active() == []
        assert agent._log_relay.wait_idle(5)
        assert AgentTask.objects.filter(kind="stream_logs").count() == 1
        assert AgentTask.objects.filter(kind="cancel_logs").count() == 1
    finally:
        for viewer in (first, second):
            if viewer is not None:
                viewer.close()
        agent._log_relay.cancel_all()
        backend.remove(runner.pk)
        client.close()


def test_log06_a_finished_runners_stream_is_the_output_the_controller_kept(server):
    """LOG-06: a finished runner's workload is gone; its stream is the kept end of its
    output, then the end, and no host is asked for anything."""
    host, _ = join("done-host")
    runner = make_runner(host, "failed")
    Runner.objects.filter(pk=runner.pk).update(output_tail="step 3 failed: exit 2\n")
    viewer = Viewer(f"{server.url}/api/v1/runners/{runner.pk}/logs", viewer_token())
    try:
        assert viewer.event() == ("stream", {"stream_id": None, "shared": False})
        assert viewer.event() == ("output", {"text": "step 3 failed: exit 2\n"})
        name, data = viewer.event()
        assert name == "end" and "finished" in data["reason"]
    finally:
        viewer.close()
    assert not AgentTask.objects.filter(kind="stream_logs").exists()
    # Anonymous callers are refused; a runner that does not exist is a 404.
    url = f"{server.url}/api/v1/runners/{runner.pk}/logs"
    assert httpx.get(url, timeout=10).status_code == 401
    missing = httpx.get(
        f"{server.url}/api/v1/runners/999999/logs",
        headers={"Authorization": f"Bearer {viewer_token('operator')}"},
        timeout=10,
    )
    assert missing.status_code == 404


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_log05_a_viewer_that_never_reads_does_not_grow_the_web_server(server):
    """LOG-05, measured on the production web server: a viewer's socket that reads nothing
    while 12 MB of output is relayed to it. The server's resident memory grows by less
    than half of that (plain daphne grows by all of it and more: bench/log_relay.py):
    the relay's bounded queue for that viewer is what fills, and it drops (the marker it
    leaves is test_log_hub's); the agent's chunks are taken all along."""
    host, agent_token = join("busy-host")
    runner = make_runner(host, "idle")
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(
        f"GET /api/v1/runners/{runner.pk}/logs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {viewer_token()}\r\n\r\n".encode()
    )
    try:
        wait_for(
            lambda: AgentTask.objects.filter(runner=runner, kind="stream_logs").exists(),
            15,
            "the stream_logs task",
        )
        stream = AgentTask.objects.get(runner=runner, kind="stream_logs").payload["stream_id"]
        agent = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {agent_token}"}, timeout=30
        )
        body = json.dumps({"data": ("y" * 99 + "\n") * 480})  # 48,000 bytes
        for _ in range(60):  # past the kernel's buffers and the queue's bound first
            assert agent.post(f"/api/v1/agent/logs/{stream}", content=body).json() == {"open": True}
        before = rss_kib(server.pid)
        for _ in range(250):  # 12 MB
            answer = agent.post(f"/api/v1/agent/logs/{stream}", content=body)
            assert answer.json() == {"open": True}
        grown = rss_kib(server.pid) - before
        agent.close()
        assert grown < 5 * 1024, f"the server grew {grown} KiB for 12 MB its viewer never read"
    finally:
        sock.close()
