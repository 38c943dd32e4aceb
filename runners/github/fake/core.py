"""The fake GitHub's plumbing: constants, the request/response/error types every section
shares, and the HTTP server that hands each request to the callable it is given.

It imports no other part of the fake but shapes.py, and state.py's records for annotations
(state.py imports nothing back): the sections build on both."""

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
    from runners.github.fake.state import FakeState, Token

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
ALL_RUNNERS = "*"  # hold_runners_offline's every runner (no runner name is "*")

_key_lock = threading.Lock()
_key_cache: list[rsa.RSAPrivateKey] = []


def shared_key() -> rsa.RSAPrivateKey:
    # One RSA key per process: generating one costs ~50 ms and each fake has its own app id.
    with _key_lock:
        if not _key_cache:
            _key_cache.append(rsa.generate_private_key(public_exponent=65537, key_size=2048))
        return _key_cache[0]


class HttpError(Exception):
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
class Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Any
    raw_body: bytes
    params: dict[str, str] = field(default_factory=dict)
    installation_id: int | None = None
    token: Token | None = None
    principal: tuple[Any, ...] = ("anon",)

    def q(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def json(self, *, required: bool = True) -> Any:
        if not self.raw_body.strip():
            if required:
                raise HttpError(400, "Problems parsing JSON")
            return {}
        try:
            return json.loads(self.raw_body)
        except ValueError:
            raise HttpError(400, "Problems parsing JSON") from None


# A GitHub route: method, path pattern, the credentials it takes ("jwt", "token" or "any"),
# and the section's function that answers it.
Handler = Callable[["FakeState", Request], Response]
Route = tuple[str, re.Pattern[str], str, Handler]


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with daemon threads and Nagle off on every accepted socket."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    # socketserver's default backlog of 5 overflows in a burst, and the kernel then drops a
    # connect that the client retries a second later: a fake must not add latency.
    request_queue_size = 128
    # (method, path with query, headers, body) -> the answer; FakeGitHub sets it.
    dispatch: Callable[[str, str, Any, bytes], Response]

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        # Without TCP_NODELAY a small response waits for the delayed ACK: ~40 ms a call.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, addr


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "GitHub.com"
    sys_version = ""
    timeout = 120  # idle keep-alive connections should not pin a thread for ever
    server: Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        response = self.server.dispatch(self.command, self.path, self.headers, raw)
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


ALNUM = string.ascii_letters + string.digits


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def positive_int(value: str | None, default: int) -> int:
    try:
        number = int(value) if value is not None else default
    except ValueError:
        return default
    return number if number >= 1 else default


def json_object(req: Request) -> dict[str, Any]:
    body = req.json()
    if not isinstance(body, dict):
        raise HttpError(422, "the body must be a JSON object")
    return body
