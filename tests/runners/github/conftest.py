"""Fixtures for the fake GitHub's own tests (FAKE-01..04).

`fake_github` is a started fake on a movable clock; `gh` talks to it over real HTTP and
records every GitHub API response, which the FAKE-03 test validates against GitHub's
schemas; `webhook_receiver` is a small real server that records the deliveries it gets.
Nothing here needs Django.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from runners.github.client import GitHubApp
from runners.github.fake import FakeGitHub

REPO_ROOT = Path(__file__).resolve().parents[3]
WEBHOOK_SECRET = "It's a Secret to Everybody"
# GitHub's material: the copy in tests/fixtures/github, unless an env var points elsewhere.
MATERIAL_ENV = "ZOOMIES_GITHUB_MATERIAL"


def github_material() -> Path:
    """The folder with response-schemas.json; a test that needs it fails if it is missing."""
    candidates = [
        os.environ.get(MATERIAL_ENV, ""),
        str(REPO_ROOT / "tests" / "fixtures" / "github"),
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "response-schemas.json").is_file():
            return Path(candidate)
    raise FileNotFoundError(
        f"GitHub's response-schemas.json not found in {candidates}; set {MATERIAL_ENV}"
    )


def _format_checker() -> jsonschema.FormatChecker:
    """jsonschema's checker plus date-time and uri, whose checks need packages we lack."""
    checker = jsonschema.FormatChecker()

    @checker.checks("date-time", raises=ValueError)
    def date_time(value: object) -> bool:
        if not isinstance(value, str):
            return True
        return datetime.fromisoformat(value).tzinfo is not None

    @checker.checks("uri")
    def uri(value: object) -> bool:
        if not isinstance(value, str):
            return True
        parts = urllib.parse.urlsplit(value)
        return bool(parts.scheme) and " " not in value

    return checker


FORMATS = _format_checker()


class MovableClock:
    """Real time plus an offset a test moves, so nothing waits for time to pass."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class Recorded:
    """One GitHub API response a test received."""

    method: str
    path: str
    status: int
    headers: dict[str, str]
    body: Any


_KEYS: dict[str, Any] = {}

# Every GitHub API response of the session, for the FAKE-03 walk.
RESPONSES: list[Recorded] = []


class SchemaBook:
    """GitHub's response and webhook schemas (response-schemas.json), with a matcher."""

    WEBHOOK_KEYS = {
        "queued": "workflow-job-queued",
        "waiting": "workflow-job-waiting",
        "in_progress": "workflow-job-in-progress",
        "completed": "workflow-job-completed",
    }

    def __init__(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self.operations: dict[str, Any] = data["operations"]
        self.webhooks: dict[str, Any] = data["webhooks"]
        self._validators: dict[str, Any] = {}
        patterns = []
        for key in self.operations:
            method, template = key.split(" ", 1)
            regex = re.sub(r"\\\{(\w+)\\\}", r"[^/]+", re.escape(template))
            # Literal segments win over parameters (`runners/downloads` over `{runner_id}`).
            patterns.append((template.count("{"), method, re.compile(regex), key))
        self._patterns = sorted(patterns, key=lambda p: p[0])
        # A documented error shape for statuses an operation does not list (401, 403, 429).
        self.basic_error = self.operations["GET /app/installations/{installation_id}"]["responses"][
            "404"
        ]["schema"]

    def operation(self, method: str, path: str) -> str | None:
        for _, op_method, regex, key in self._patterns:
            if op_method == method and regex.fullmatch(path):
                return key
        return None

    def _validator(self, key: str, schema: dict[str, Any]) -> Any:
        if key not in self._validators:
            cls = jsonschema.validators.validator_for(
                schema, default=jsonschema.Draft202012Validator
            )
            self._validators[key] = cls(schema, format_checker=FORMATS)
        return self._validators[key]

    def validate_response(self, rec: Recorded) -> str:
        """Raise if the response breaks its schema; returns the operation key it matched."""
        key = self.operation(rec.method, rec.path)
        documented = self.operations[key]["responses"] if key else {}
        entry = documented.get(str(rec.status))
        if entry is None and rec.status == 304:
            # GitHub answers any conditional GET whose ETag still holds with 304 and no body
            # (docs: "Use conditional requests if appropriate"), listed by the spec or not.
            assert rec.method == "GET", f"{rec.method} {rec.path}: 304 to a non-GET"
            assert rec.body is None, f"{rec.method} {rec.path} 304 must have no body"
            assert any(k.lower() == "etag" for k in rec.headers), "a 304 names its ETag"
            return f"{key or rec.method + ' ' + rec.path} 304"
        if entry is None:
            assert rec.status >= 400, f"{rec.method} {rec.path}: undocumented {rec.status}"
            assert isinstance(rec.body, dict), f"{rec.method} {rec.path}: error without body"
            assert isinstance(rec.body.get("message"), str)
            assert isinstance(rec.body.get("documentation_url"), str)
            self._validator("basic-error", self.basic_error).validate(rec.body)
            return f"{key or rec.method + ' ' + rec.path} {rec.status}"
        if entry["schema"] is None:
            assert rec.body is None, f"{rec.method} {rec.path} {rec.status} must have no body"
        else:
            self._validator(f"{key} {rec.status}", entry["schema"]).validate(rec.body)
        return f"{key} {rec.status}"

    def validate_webhook(self, payload: dict[str, Any]) -> None:
        key = self.WEBHOOK_KEYS[payload["action"]]
        self._validator(key, self.webhooks[key]["schema"]).validate(payload)


class GitHubClient:
    """An httpx client for the fake that records every GitHub API response it gets."""

    def __init__(self, fake: FakeGitHub) -> None:
        self.fake = fake
        self.http = httpx.Client(
            base_url=fake.url, timeout=10, event_hooks={"response": [self._record]}
        )

    def _record(self, response: httpx.Response) -> None:
        path = response.request.url.path
        if path.startswith(("/_fake/", "/_runner/")):
            return
        response.read()
        body = response.json() if response.content else None
        headers = {k.lower(): v for k, v in response.headers.items()}
        RESPONSES.append(
            Recorded(response.request.method, path, response.status_code, headers, body)
        )

    def app_jwt(
        self,
        *,
        iat: float | None = None,
        exp: float | None = None,
        iss: Any = None,
        key: str | None = None,
    ) -> str:
        """An App JWT like a client mints one (a minute back-dated, nine minutes ahead)."""
        now = int(self.fake.clock())
        claims = {
            "iat": int(iat) if iat is not None else now - 60,
            "exp": int(exp) if exp is not None else now + 540,
            "iss": iss if iss is not None else str(self.fake.app_id),
        }
        return jwt.encode(claims, self._key(key or self.fake.private_key_pem), algorithm="RS256")

    def _key(self, pem: str) -> Any:
        # Loading a PEM validates the RSA key (~60 ms); sign with a loaded key instead.
        if pem not in _KEYS:
            _KEYS[pem] = serialization.load_pem_private_key(pem.encode(), password=None)
        return _KEYS[pem]

    def app(self, **claims: Any) -> dict[str, str]:
        """Headers authenticating as the App."""
        return {"Authorization": f"Bearer {self.app_jwt(**claims)}"}

    def token(self, installation_id: int, **body: Any) -> str:
        answer = self.http.post(
            f"/app/installations/{installation_id}/access_tokens",
            headers=self.app(),
            json=body or None,
        )
        assert answer.status_code == 201, answer.text
        return answer.json()["token"]

    def inst(self, installation_id: int, **body: Any) -> dict[str, str]:
        """Headers authenticating as the installation (a fresh token)."""
        return {"Authorization": f"token {self.token(installation_id, **body)}"}

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.post(path, **kw)

    def delete(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.delete(path, **kw)

    def close(self) -> None:
        self.http.close()


@dataclass
class Received:
    """One delivery the receiver got."""

    at: float
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    """A real HTTP server that records POSTed deliveries and answers `status`, once `answering`
    is set (clear it to hold every answer, as a receiver stalled on its database would)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.status = 202
        self.answering = threading.Event()
        self.answering.set()
        self._cv = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._cv:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.received.append(Received(time.monotonic(), headers, body))
                    receiver._cv.notify_all()
                receiver.answering.wait(30)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket.socket, Any]:
                sock, addr = super().get_request()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock, addr

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/webhooks/github"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        with self._cv:
            if not self._cv.wait_for(lambda: len(self.received) >= count, timeout):
                raise TimeoutError(f"{len(self.received)} of {count} deliveries arrived")
            return list(self.received)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def fake_github_clock() -> MovableClock:
    return MovableClock()


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def fake_github(fake_github_clock: MovableClock) -> Iterator[FakeGitHub]:
    """A started fake GitHub on a movable clock, sending no webhooks."""
    fake = FakeGitHub(clock=fake_github_clock).start()
    yield fake
    fake.stop()


@pytest.fixture
def hooked_github(
    fake_github_clock: MovableClock, webhook_receiver: WebhookReceiver
) -> Iterator[FakeGitHub]:
    """A started fake GitHub that delivers signed webhooks to `webhook_receiver`."""
    fake = FakeGitHub(
        webhook_url=webhook_receiver.url, webhook_secret=WEBHOOK_SECRET, clock=fake_github_clock
    ).start()
    yield fake
    fake.stop()


@pytest.fixture
def gh(fake_github: FakeGitHub) -> Iterator[GitHubClient]:
    client = GitHubClient(fake_github)
    yield client
    client.close()


@pytest.fixture
def hooked_gh(hooked_github: FakeGitHub) -> Iterator[GitHubClient]:
    client = GitHubClient(hooked_github)
    yield client
    client.close()


@pytest.fixture(scope="session")
def github_schemas() -> SchemaBook:
    return SchemaBook(github_material() / "response-schemas.json")


@pytest.fixture
def recorded_responses() -> list[Recorded]:
    """The GitHub API responses every test of this session has received so far."""
    return RESPONSES


# -- recording what the client saw --------------------------------------------------------


@dataclass
class Seen:
    """One exchange as the client's transport saw it (duck-types the conftest's Recorded)."""

    method: str
    path: str
    query: dict[str, list[str]]
    request_headers: httpx.Headers
    status: int
    headers: httpx.Headers
    body: Any


class RecordingTransport(httpx.HTTPTransport):
    """The real transport, keeping a copy of each exchange; `strip` drops a GHES prefix."""

    def __init__(self, strip: str = "") -> None:
        super().__init__()
        self.strip = strip
        self.seen: list[Seen] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        path = request.url.path
        if self.strip and path.startswith(self.strip):
            path = path[len(self.strip) :]
        body = json.loads(response.content) if response.content else None
        seen = Seen(
            request.method,
            path,
            urllib.parse.parse_qs(request.url.query.decode()),
            request.headers,
            response.status_code,
            response.headers,
            body,
        )
        with self._lock:
            self.seen.append(seen)
        return response

    def statuses(self, method: str, path: str) -> list[int]:
        return [s.status for s in self.seen if s.method == method and s.path == path]


@pytest.fixture
def recorder(github_schemas) -> Iterator[RecordingTransport]:
    transport = RecordingTransport()
    yield transport
    # FAKE-03 from the client's side: whatever it got, GitHub's schemas allow.
    for seen in transport.seen:
        github_schemas.validate_response(seen)


@pytest.fixture
def app(fake_github, fake_github_clock, recorder) -> Iterator[GitHubApp]:
    with GitHubApp(
        fake_github.app_id,
        fake_github.private_key_pem,
        base_url=fake_github.url,
        clock=fake_github_clock,
        transport=recorder,
    ) as github_app:
        yield github_app
