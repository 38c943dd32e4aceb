"""A fake controller speaking docs/agent-protocol.md over real HTTP, and agents to point at it.

The fake is a stdlib ThreadingHTTPServer on 127.0.0.1: it records every call, hands out
the tasks a test enqueues, and can be told to refuse, fail or revoke. It reads every
request and writes every answer through fleet/protocol/, the schema the real controller
and the agent share, so a request the real controller would refuse is a 400 here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from fleet import protocol

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
    # The other timings the controller's answers carry (agent.* settings).
    tunables: protocol.AgentTunables = field(default_factory=protocol.AgentTunables)
    cordoned: bool = False
    cpu_factor: float = 1.0  # HOST-20: what each heartbeat answer carries
    memory: protocol.MemoryRules | None = None  # HOST-24: likewise
    heartbeats: list[protocol.HeartbeatRequest] = field(default_factory=list)  # as read
    refused_runner_ids: set[int] = field(default_factory=set)
    reports_status: int = 200  # set to 503 to make the controller drop reports
    results_refused: int = 0  # the next this many result posts are answered 503 (busy)
    grouped_results: bool = True  # False: no `POST tasks/results`, as an older controller
    # Set: each `POST tasks/results` waits for it before answering (a slow controller).
    results_gate: threading.Event | None = None
    calls: list[Call] = field(default_factory=list)
    tasks: dict[int, FakeTask] = field(default_factory=dict)
    results: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)  # accepted POSTs, flattened
    agent_tokens: dict[str, int] = field(default_factory=dict)
    # The runners the inventory answer says the host holds (`protocol.ExpectedRunner`).
    expected: list[protocol.ExpectedRunner] = field(default_factory=list)
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

    def _tunables(self) -> protocol.AgentTunables:
        return dataclasses.replace(self.tunables, heartbeat_interval=self.heartbeat_interval)

    def _route(self, method, path, query, body, headers) -> tuple[int, dict[str, Any]]:
        try:
            return self._answer(method, path, query, body, headers)
        except protocol.ProtocolError as exc:
            return 400, protocol.ErrorAnswer(str(exc), exc.path).to_json()

    def _answer(self, method, path, query, body, headers) -> tuple[int, dict[str, Any]]:
        if (method, path) == ("POST", "/api/v1/agent/join"):
            join = protocol.JoinRequest.from_json(body)
            with self.cond:
                if join.join_token not in self.join_tokens:
                    return 401, {"error": "That join token is unknown, expired or spent."}
                self.join_tokens.discard(join.join_token)  # single-use
                token = f"{AGENT_TOKEN_PREFIX}{len(self.agent_tokens) + 1:032d}"
                self.agent_tokens[token] = 7
            answer = protocol.JoinAnswer(host_id=7, agent_token=token, tunables=self._tunables())
            return 200, answer.to_json()
        if self._host(headers) is None:
            return 401, {"error": "This agent token is not valid."}
        if (method, path) == ("POST", "/api/v1/agent/heartbeat"):
            self.heartbeats.append(protocol.HeartbeatRequest.from_json(body))
            beat = protocol.HeartbeatAnswer(
                cordoned=self.cordoned, tunables=self._tunables(), cpu_factor=self.cpu_factor,
                memory=self.memory,
            )  # fmt: skip
            return 200, beat.to_json()
        if (method, path) == ("GET", "/api/v1/agent/tasks"):
            wait = protocol.parse_wait(query.get("wait", [""])[0], 25.0)
            with self.cond:
                self.cond.wait_for(
                    lambda: self._closing or any(t.state == "pending" for t in self.tasks.values()),
                    timeout=wait,
                )
                taken = [t for t in self.tasks.values() if t.state == "pending"]
                for task in taken:
                    task.state = "in_flight"
            wire = protocol.TaskList(
                tasks=tuple(
                    protocol.Task(t.id, t.kind, t.attempt, t.runner_id, t.payload) for t in taken
                ),
                # As the controller does: the cordon as of the take, with tasks only.
                cordoned=self.cordoned if taken else None,
            )
            return 200, wire.to_json()
        if (method, path) == ("POST", "/api/v1/agent/tasks/results") and self.grouped_results:
            batch = protocol.TaskResultsRequest.from_json(body)
            if self.results_gate is not None:
                self.results_gate.wait(timeout=30)
            with self.cond:
                if self.results_refused > 0:  # the whole batch, as the controller's 503 is
                    self.results_refused -= 1
                    return 503, {"error": "The database is unavailable; try again."}
                outcomes = tuple(self._close(item.id, item.result) for item in batch.results)
            return 200, protocol.TaskResultsAnswer(results=outcomes).to_json()
        if method == "POST" and path.startswith("/api/v1/agent/tasks/"):
            if not path.endswith("/result") or not path.split("/")[-2].isdigit():
                return 404, {"error": f"No route for {method} {path}."}
            task_id = int(path.split("/")[-2])
            result = protocol.TaskResult.from_json(body)
            with self.cond:
                if self.results_refused > 0:
                    self.results_refused -= 1
                    return 503, {"error": "The database is unavailable; try again."}
                outcome = self._close(task_id, result)
            if not outcome.accepted:
                return outcome.status or 409, {"error": outcome.error}
            return 200, protocol.TaskResultAnswer(accepted=True).to_json()
        if (method, path) == ("POST", "/api/v1/agent/inventory"):
            # Read and answered only: the real controller's settling of the tasks in flight
            # is tested against it (tests/fleet/test_inventory.py).
            protocol.InventoryRequest.from_json(body)
            with self.cond:
                answer = protocol.InventoryAnswer(runners=tuple(self.expected))
            return 200, answer.to_json()
        if (method, path) == ("POST", "/api/v1/agent/reports"):
            if self.reports_status != 200:
                return self.reports_status, {"error": "The controller is busy."}
            batch = protocol.ReportsRequest.from_json(body)
            ids = [r.runner_id for r in batch.reports]
            with self.cond:
                self.reports.extend(r.to_json() for r in batch.reports)
            refused = tuple(sorted({i for i in ids if i in self.refused_runner_ids}))
            accepted = tuple(sorted({i for i in ids if i not in self.refused_runner_ids}))
            return 200, protocol.ReportsAnswer(accepted=accepted, refused=refused).to_json()
        return 404, {"error": f"No route for {method} {path}."}

    def _close(self, task_id: int, result: protocol.TaskResult) -> protocol.TaskResultOutcome:
        """One result, as the controller records it (called holding `cond`)."""
        task = self.tasks.get(task_id)
        if task is None:
            return protocol.TaskResultOutcome(task_id, False, 404, "No such task for this host.")
        if task.state != "in_flight":
            return protocol.TaskResultOutcome(
                task_id, False, 409, "That task is no longer in flight."
            )
        task.state = "done"
        self.results.append((task_id, result.to_json()))
        return protocol.TaskResultOutcome(task_id, True)

    def close(self) -> None:
        with self.cond:
            self._closing = True
            self.cond.notify_all()


class FakeControllerHandler(BaseHTTPRequestHandler):
    server: FakeControllerServer

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = protocol.loads(raw)
        except protocol.ProtocolError as exc:
            self._send(400, protocol.ErrorAnswer(str(exc), exc.path).to_json())
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, answer = self.server.controller.handle(method, self.path, body, headers)
        self._send(status, answer)

    def _send(self, status: int, answer: dict[str, Any]) -> None:
        data = protocol.dumps(answer).encode()
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
def serving(
    fake: FakeController, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> Iterator[FakeController]:
    """Serve `fake` on an ephemeral port of 127.0.0.1 for the length of the block; over
    HTTPS with `tls` (a server context), as `https://{host}:port`."""
    server = FakeControllerServer(("127.0.0.1", 0), FakeControllerHandler)
    server.controller = fake
    scheme = "http"
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    fake.url = f"{scheme}://{host}:{server.server_address[1]}"
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
