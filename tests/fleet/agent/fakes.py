"""A fake controller speaking docs/agent-protocol.md over real HTTP, and agents to point at it.

The fake is a stdlib ThreadingHTTPServer on 127.0.0.1: it records every call, hands out
the tasks a test enqueues, and can be told to refuse, fail or revoke.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

JOIN_TOKEN = "zjt_test_join_token_0123456789"
AGENT_TOKEN_PREFIX = "zat_"


@dataclass
class Call:
    """One request the fake controller received."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]
    status: int = 0


@dataclass
class FakeTask:
    """A task row: pending until taken, in flight until its result arrives."""

    id: int
    kind: str
    runner_id: int
    payload: dict[str, Any]
    attempt: int = 1
    state: str = "pending"


@dataclass
class FakeController:
    """The controller half of the protocol, small enough to read in one go."""

    join_tokens: set[str] = field(default_factory=lambda: {JOIN_TOKEN})
    heartbeat_interval: float = 30
    cordoned: bool = False
    refused_runner_ids: set[int] = field(default_factory=set)
    reports_status: int = 200  # set to 503 to make the controller drop reports
    calls: list[Call] = field(default_factory=list)
    tasks: dict[int, FakeTask] = field(default_factory=dict)
    results: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)  # accepted POSTs, flattened
    agent_tokens: dict[str, int] = field(default_factory=dict)
    url: str = ""

    def __post_init__(self) -> None:
        self.cond = threading.Condition()
        self._next_id = 1
        self._closing = False

    # -- what tests do ------------------------------------------------------------------

    def enqueue(
        self, kind: str, runner_id: int, payload: dict[str, Any] | None = None, attempt: int = 1
    ) -> int:
        with self.cond:
            task_id = self._next_id
            self._next_id += 1
            body = {"runner_id": runner_id, **(payload or {})}
            self.tasks[task_id] = FakeTask(task_id, kind, runner_id, body, attempt)
            self.cond.notify_all()
            return task_id

    def enqueue_create(
        self, runner_id: int, command: list[str], attempt: int = 1, **extra: Any
    ) -> int:
        payload = {
            "runner_id": runner_id,
            "runner_name": f"zoomies-test-{runner_id}",
            "pool": "zoomies-linux-x64",
            "backend": "process",
            "image": "ghcr.io/example/runner:latest",
            "command": command,
            "env": {"ACTIONS_RUNNER_INPUT_JITCONFIG": f"jit-{runner_id}"},
            "cpus": None,
            "memory_mb": None,
            "ephemeral": True,
            **extra,
        }
        return self.enqueue("create_runner", runner_id, payload, attempt)

    def revoke_agent_tokens(self) -> None:
        with self.cond:
            self.agent_tokens.clear()

    def calls_to(self, suffix: str) -> list[Call]:
        with self.cond:
            return [c for c in self.calls if c.path.endswith(suffix)]

    def reports_for(self, runner_id: int) -> list[dict[str, Any]]:
        with self.cond:
            return [r for r in self.reports if r["runner_id"] == runner_id]

    def result_of(self, task_id: int) -> dict[str, Any] | None:
        with self.cond:
            found = [body for tid, body in self.results if tid == task_id]
        return found[-1] if found else None

    # -- serving ------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: Any, headers: dict[str, str]):
        parsed = urlparse(raw_path)
        path = parsed.path
        call = Call(method, path, body, headers)
        with self.cond:
            self.calls.append(call)
        status, answer = self._route(method, path, parse_qs(parsed.query), body, headers)
        call.status = status
        return status, answer

    def _host(self, headers: dict[str, str]) -> int | None:
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return None
        with self.cond:
            return self.agent_tokens.get(auth[len("Bearer ") :])

    def _route(self, method, path, query, body, headers) -> tuple[int, dict[str, Any]]:
        if (method, path) == ("POST", "/api/v1/agent/join"):
            with self.cond:
                if body.get("join_token") not in self.join_tokens:
                    return 401, {"error": "That join token is unknown, expired or spent."}
                self.join_tokens.discard(body["join_token"])  # single-use
                token = f"{AGENT_TOKEN_PREFIX}{len(self.agent_tokens) + 1:032d}"
                self.agent_tokens[token] = 7
            return 200, {"host_id": 7, "agent_token": token, "heartbeat_interval": 30}
        if self._host(headers) is None:
            return 401, {"error": "This agent token is not valid."}
        if (method, path) == ("POST", "/api/v1/agent/heartbeat"):
            return 200, {"heartbeat_interval": self.heartbeat_interval, "cordoned": self.cordoned}
        if (method, path) == ("GET", "/api/v1/agent/tasks"):
            wait = min(float(query.get("wait", ["25"])[0]), 30.0)
            with self.cond:
                self.cond.wait_for(
                    lambda: self._closing or any(t.state == "pending" for t in self.tasks.values()),
                    timeout=wait,
                )
                taken = [t for t in self.tasks.values() if t.state == "pending"]
                for task in taken:
                    task.state = "in_flight"
            return 200, {
                "tasks": [
                    {
                        "id": t.id,
                        "kind": t.kind,
                        "attempt": t.attempt,
                        "runner_id": t.runner_id,
                        "payload": t.payload,
                    }
                    for t in taken
                ]
            }
        if method == "POST" and path.startswith("/api/v1/agent/tasks/"):
            task_id = int(path.split("/")[-2])
            with self.cond:
                task = self.tasks.get(task_id)
                if task is None:
                    return 404, {"error": "No such task for this host."}
                if task.state != "in_flight":
                    return 409, {"error": "That task is no longer in flight."}
                task.state = "done"
                self.results.append((task_id, body))
            return 200, {"accepted": True}
        if (method, path) == ("POST", "/api/v1/agent/reports"):
            if self.reports_status != 200:
                return self.reports_status, {"error": "The controller is busy."}
            ids = [r["runner_id"] for r in body["reports"]]
            with self.cond:
                self.reports.extend(body["reports"])
            refused = sorted({i for i in ids if i in self.refused_runner_ids})
            accepted = sorted({i for i in ids if i not in self.refused_runner_ids})
            return 200, {"accepted": accepted, "refused": refused}
        return 404, {"error": f"No route for {method} {path}."}

    def close(self) -> None:
        with self.cond:
            self._closing = True
            self.cond.notify_all()


class FakeControllerHandler(BaseHTTPRequestHandler):
    server: FakeControllerServer

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, answer = self.server.controller.handle(method, self.path, body, headers)
        data = json.dumps(answer).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent gave up on a long-poll (it stopped): nobody is listening

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class FakeControllerServer(ThreadingHTTPServer):
    daemon_threads = True
    controller: FakeController


@contextlib.contextmanager
def serving(fake: FakeController) -> Iterator[FakeController]:
    """Serve `fake` on an ephemeral port of 127.0.0.1 for the length of the block."""
    server = FakeControllerServer(("127.0.0.1", 0), FakeControllerHandler)
    server.controller = fake
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.close()
        server.shutdown()
        server.server_close()


class FakeClock:
    """The agent's clock, moved by hand across grace periods."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll with a deadline instead of sleeping for a guessed time."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout} s: {predicate}")
        time.sleep(interval)
