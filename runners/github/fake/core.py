"""The fake GitHub's plumbing: constants, its state records, request/response/error types and
the HTTP server that hands every request to `FakeGitHub._dispatch`."""

from __future__ import annotations

import base64
import json
import re
import socket
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric import rsa

from runners.github.fake.shapes import DOCS

if TYPE_CHECKING:
    from runners.github.fake.server import FakeGitHub

RATE_DOCS = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api"
SECONDARY_DOCS = RATE_DOCS + "#about-secondary-rate-limits"
CONCLUSIONS = (
    "success",
    "failure",
    "neutral",
    "cancelled",
    "skipped",
    "timed_out",
    "action_required",
)

INSTALLATION_LIMIT = 5000  # GitHub's floor for installation tokens, per hour
APP_LIMIT = 5000
ANON_LIMIT = 60
RATE_WINDOW = 3600.0
JWT_MAX_LIFETIME = 600  # exp at most 10 min after iat
JWT_IAT_LEEWAY = 30  # how far in the future an iat may be, for clock drift
LONG_POLL_MAX = 50.0
DELIVERY_TIMEOUT = 10.0  # GitHub gives up on a hook after 10 s
REDELIVERY_WINDOW = 3 * 86400  # github.com redelivers deliveries of the past 3 days only
RUNNER_NAME_MAX = 64

_key_lock = threading.Lock()
_key_cache: list[rsa.RSAPrivateKey] = []


def _shared_key() -> rsa.RSAPrivateKey:
    # One RSA key per process: generating one costs ~50 ms and each fake has its own app id.
    with _key_lock:
        if not _key_cache:
            _key_cache.append(rsa.generate_private_key(public_exponent=65537, key_size=2048))
        return _key_cache[0]


class _Error(Exception):
    """An HTTP error answer in GitHub's basic-error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        documentation_url: str = DOCS,
        errors: list[Any] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.documentation_url = documentation_url
        self.errors = errors

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message, "documentation_url": self.documentation_url}
        if self.errors is not None:
            out["errors"] = self.errors
        out["status"] = str(self.status)
        return out


@dataclass
class _Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Any
    raw_body: bytes
    params: dict[str, str] = field(default_factory=dict)
    installation_id: int | None = None
    token: _Token | None = None
    principal: tuple[Any, ...] = ("anon",)

    def q(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def json(self, *, required: bool = True) -> Any:
        if not self.raw_body.strip():
            if required:
                raise _Error(400, "Problems parsing JSON")
            return {}
        try:
            return json.loads(self.raw_body)
        except ValueError:
            raise _Error(400, "Problems parsing JSON") from None


@dataclass
class _Installation:
    id: int
    account: str
    account_type: str
    account_id: int
    repositories: list[str]
    created_at: float


@dataclass
class _Repo:
    id: int
    owner: str
    name: str
    installation_id: int
    created_at: float

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass
class _Token:
    token: str
    installation_id: int
    expires_at: float
    repositories: set[str] | None  # lower-case full names when the token was narrowed
    permissions: dict[str, str]
    revoked: bool = False


@dataclass
class _Runner:
    id: int
    name: str
    installation_id: int
    scope: tuple[str, str]  # ("org", "acme") or ("repo", "acme/app"), lower-case
    labels: list[dict[str, Any]]
    secret: str
    ephemeral: bool = True
    os: str = "unknown"
    version: str | None = None
    session: str | None = None
    session_used: bool = False
    polling: int = 0
    last_seen: float | None = None
    job_id: int | None = None
    job_handed: bool = False
    waiting_since: float = 0.0


@dataclass
class _Run:
    id: int
    repo: str
    installation_id: int
    name: str
    run_number: int
    head_sha: str
    created_at: float
    job_ids: list[int] = field(default_factory=list)
    updated_at: float = 0.0


@dataclass
class _Job:
    id: int
    run_id: int
    repo: str
    installation_id: int
    name: str
    labels: list[str]
    duration: float
    wanted_conclusion: str
    created_at: float
    status: str = "queued"
    conclusion: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    runner_id: int | None = None
    runner_name: str | None = None


@dataclass
class _Limit:
    until: float | None
    retry_after: int | None


@dataclass
class _Quota:
    limit: int
    reset: float
    used: int = 0


@dataclass(order=True)
class _Outgoing:
    due: float
    seq: int
    delivery_id: str = field(compare=False)
    job_id: int = field(compare=False)
    action: str = field(compare=False)
    url: str = field(compare=False)
    body: bytes = field(compare=False)
    headers: dict[str, str] = field(compare=False)
    lag: float = field(default=0.0, compare=False)  # extra seconds after the others it goes with
    redelivery: bool = field(default=False, compare=False)  # asked for by .../attempts


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with daemon threads and Nagle off on every accepted socket."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    # socketserver's default backlog of 5 overflows in a burst, and the kernel then drops a
    # connect that the client retries a second later: a fake must not add latency.
    request_queue_size = 128
    fake: FakeGitHub

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        # Without TCP_NODELAY a small response waits for the delayed ACK: ~40 ms a call.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, addr


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "GitHub.com"
    sys_version = ""
    timeout = 120  # idle keep-alive connections should not pin a thread for ever
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        response = self.server.fake._dispatch(self.command, self.path, self.headers, raw)
        payload = b""
        if response.body is not None:
            payload = json.dumps(response.body, separators=(",", ":")).encode()
        self.send_response(response.status)
        if response.body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if payload and self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


_Route = tuple[str, re.Pattern[str], str, Callable[..., _Response]]

_ALNUM = string.ascii_letters + string.digits


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _positive_int(value: str | None, default: int) -> int:
    try:
        number = int(value) if value is not None else default
    except ValueError:
        return default
    return number if number >= 1 else default


def _object(req: _Request) -> dict[str, Any]:
    body = req.json()
    if not isinstance(body, dict):
        raise _Error(422, "the body must be a JSON object")
    return body
