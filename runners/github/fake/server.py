"""The fake GitHub: a real HTTP server speaking the slice of GitHub's REST API Zoomies uses.

It authenticates App JWTs and installation tokens, mints JIT runner configurations, hands
queued jobs to the fake runners (runner.py) that consume them, and sends the signed
`workflow_job` deliveries GitHub would send. Tests and people steer it through the Python
methods of FakeGitHub or the /_fake/ HTTP routes. Standard library plus PyJWT and
cryptography only: no Django, no Zoomies import, so it also runs on its own.

Private routes (not GitHub's):

* Runner protocol, used by runner.py. `POST /_runner/sessions {runner_id, secret, os, arch,
  version}` -> 201 `{session, runner}` (401 bad secret, 404 unknown or removed runner, 409 the
  JIT config was already used); then with `Authorization: Bearer <session>`:
  `GET /_runner/jobs?wait=S` long-polls (max 50 s) -> 200 `{job: {id, run_id, repository,
  name, labels, duration, conclusion}}` or 204, 404 once the registration is gone;
  `POST /_runner/jobs/{id}/complete {conclusion}` -> 200 `{runner_removed}`;
  `DELETE /_runner/sessions` -> 204 (the runner goes offline).
* Control, JSON in and out: `POST /_fake/installations {account, account_type,
  repositories}` -> 201 `{id}`; `POST /_fake/jobs {repo, labels, duration, conclusion, name}`
  -> 201 job; `GET /_fake/jobs/{id}`; `POST /_fake/jobs/{id}/cancel`; `POST /_fake/rate_limit
  {installation_id, reset_in, retry_after, clear}`; `POST /_fake/delivery {drop, duplicate,
  new_ids, reorder, early_progress, queued_lag, delay}`; `POST /_fake/expire_tokens`;
  `GET /_fake/deliveries`; `GET /_fake/calls`; `GET /_fake/runners?installation_id=N`;
  `GET /_fake/info`.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import http.client
import itertools
import json
import math
import random
import re
import secrets
import socket
import string
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from runners.github.fake import shapes
from runners.github.fake.shapes import DEFAULT_GROUP_ID, DEFAULT_GROUP_NAME, DOCS, iso

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

INSTALLATION_LIMIT = 5000  # GitHub's floor for installation tokens (NOTES.md section 3)
APP_LIMIT = 5000
ANON_LIMIT = 60
RATE_WINDOW = 3600.0
JWT_MAX_LIFETIME = 600  # exp at most 10 min after iat
JWT_IAT_LEEWAY = 30  # how far in the future an iat may be, for clock drift
LONG_POLL_MAX = 50.0
DELIVERY_TIMEOUT = 10.0  # GitHub gives up on a hook after 10 s
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


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with daemon threads and Nagle off on every accepted socket."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    # socketserver's default backlog of 5 overflows in a burst, and the kernel then drops a
    # connect that the client retries a second later: a fake must not add latency (PEERS 12).
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


class FakeGitHub:
    """A fake GitHub (API, App auth, runners, jobs and webhook deliveries) on 127.0.0.1.

    `start()` serves on a background thread and returns self; `url` is the API base URL
    (like https://api.github.com). Time-dependent behaviour (token and JWT expiry, rate-limit
    resets, runner liveness) reads `clock`, so a test can move it instead of sleeping;
    delivery `delay` is real time, as it stands for network latency.
    """

    def __init__(
        self,
        webhook_url: str | None = None,
        webhook_secret: str | None = "secret",
        clock: Callable[[], float] = time.time,
        token_lifetime: float = 3600,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        app_id: int | None = None,
        private_key_pem: str | None = None,
        offline_after: float = 30.0,
    ):
        self.webhook_url = webhook_url
        self.webhook_secret = webhook_secret
        self.clock = clock
        self.token_lifetime = token_lifetime
        self.offline_after = offline_after
        self.app_id = app_id if app_id is not None else random.randint(100_000, 999_999)
        self.client_id = f"Iv23li{secrets.token_hex(7)}"
        self.app_slug = "zoomies-fake"
        self.hook_id = random.randint(400_000_000, 499_999_999)
        if private_key_pem is None:
            key = _shared_key()
        else:
            loaded = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
            if not isinstance(loaded, rsa.RSAPrivateKey):
                raise ValueError("the private key must be an RSA key")
            key = loaded
        self.private_key_pem: str = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,  # GitHub hands out PKCS#1 .pem files
            serialization.NoEncryption(),
        ).decode()
        self._public_key = key.public_key()
        self._created_at = clock()

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._ids = {
            name: itertools.count(start)
            for name, start in {
                "installation": 41_000_001,
                "account": 7_100_001,
                "repo": 880_000_001,
                "runner": 1,
                "run": 9_000_000_001,
                "job": 25_000_000_001,
                "label": 1,
            }.items()
        }
        self._installations: dict[int, _Installation] = {}
        self._repos: dict[str, _Repo] = {}  # by lower-case full name
        self._tokens: dict[str, _Token] = {}
        self._runners: dict[int, _Runner] = {}
        self._sessions: dict[str, int] = {}
        self._label_ids: dict[str, int] = {}
        self._runs: dict[int, _Run] = {}
        self._jobs: dict[int, _Job] = {}
        self._queued: dict[int, None] = {}  # queued job ids in arrival order
        self._limits: dict[int, _Limit] = {}
        self._quotas: dict[tuple[Any, ...], _Quota] = {}
        self._calls: list[tuple[str, str, int | None]] = []
        self._deliveries: list[dict[str, Any]] = []
        self._delivery_mode: dict[str, Any] = {
            "drop": False,
            "duplicate": False,
            "new_ids": False,
            "reorder": False,
            "early_progress": False,
            "queued_lag": 0.0,
            "delay": 0.0,
        }
        self._held: dict[int, list[_Outgoing]] = {}  # reorder: all of a job's, until completed
        self._late: dict[int, list[_Outgoing]] = {}  # early_progress: its queued, until started
        self._outbox: list[_Outgoing] = []
        self._outbox_seq = itertools.count()
        self._outbox_cv = threading.Condition(threading.Lock())
        self._stopping = False
        self._bind = (host, port)
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self.url = ""
        self._routes = self._github_routes()

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeGitHub:
        """Bind, serve and send deliveries on background threads; returns self."""
        if self._server is not None:
            return self
        server = _Server(self._bind, _Handler)
        server.fake = self
        self._server = server
        host, port = server.server_address[:2]
        self.url = f"http://{host}:{port}"
        serve = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        sender = threading.Thread(target=self._send_loop, daemon=True)
        self._threads = [serve, sender]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and sending; pending deliveries are discarded."""
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        with self._outbox_cv:
            self._outbox_cv.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=DELIVERY_TIMEOUT + 1)

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the Python control surface ----------------------------------------------------

    def add_installation(
        self,
        account: str,
        account_type: str = "Organization",
        repositories: list[str] | tuple[str, ...] = (),
    ) -> int:
        """Install the App on an account with these repositories; returns the installation id."""
        if account_type not in ("Organization", "User"):
            raise ValueError("account_type must be 'Organization' or 'User'")
        with self._lock:
            if any(i.account.lower() == account.lower() for i in self._installations.values()):
                raise ValueError(f"the App is already installed on {account}")
            inst = _Installation(
                id=next(self._ids["installation"]),
                account=account,
                account_type=account_type,
                account_id=next(self._ids["account"]),
                repositories=[],
                created_at=self.clock(),
            )
            self._installations[inst.id] = inst
            for full_name in repositories:
                self.add_repository(inst.id, full_name)
            return inst.id

    def add_repository(self, installation_id: int, repo: str) -> int:
        """Add a repository (`owner/name`, owned by the installation's account); its id."""
        with self._lock:
            inst = self._installations[installation_id]
            owner, _, name = repo.partition("/")
            if not name or "/" in name:
                raise ValueError(f"{repo!r} is not owner/name")
            if owner.lower() != inst.account.lower():
                raise ValueError(f"{repo} is not owned by {inst.account}")
            if repo.lower() in self._repos:
                raise ValueError(f"{repo} already belongs to an installation")
            record = _Repo(next(self._ids["repo"]), inst.account, name, inst.id, self.clock())
            self._repos[repo.lower()] = record
            inst.repositories.append(record.full_name)
            return record.id

    def queue_job(
        self,
        repo: str,
        labels: list[str] | tuple[str, ...],
        duration: float = 0.0,
        conclusion: str = "success",
        *,
        name: str = "build",
        workflow: str = "CI",
    ) -> int:
        """Start a workflow run with one queued job, send `queued`; returns the job id."""
        if conclusion not in CONCLUSIONS:
            raise ValueError(f"conclusion must be one of {CONCLUSIONS}")
        if not labels or not all(isinstance(x, str) and x for x in labels):
            raise ValueError("labels must be a non-empty list of strings")
        with self._lock:
            record = self._repos.get(repo.lower())
            if record is None:
                raise ValueError(f"{repo} is not in any installation")
            now = self.clock()
            run = _Run(
                id=next(self._ids["run"]),
                repo=record.full_name,
                installation_id=record.installation_id,
                name=workflow,
                run_number=sum(1 for r in self._runs.values() if r.repo == record.full_name) + 1,
                head_sha=secrets.token_hex(20),
                created_at=now,
                updated_at=now,
            )
            job = _Job(
                id=next(self._ids["job"]),
                run_id=run.id,
                repo=record.full_name,
                installation_id=record.installation_id,
                name=name,
                labels=list(labels),
                duration=float(duration),
                wanted_conclusion=conclusion,
                created_at=now,
            )
            run.job_ids.append(job.id)
            self._runs[run.id] = run
            self._jobs[job.id] = job
            self._queued[job.id] = None
            self._emit(job, "queued")
            self._assign_job(job)
            self._changed.notify_all()
            return job.id

    def cancel_job(self, job_id: int) -> dict[str, Any]:
        """Cancel a queued job (it completes as cancelled, with no runner); returns the job."""
        with self._lock:
            job = self._jobs[job_id]
            if job.status != "queued":
                raise ValueError(f"job {job_id} is {job.status}, not queued")
            self._queued.pop(job.id, None)
            self._finish(job, "cancelled")
            return self._job_json(job)

    def job(self, job_id: int) -> dict[str, Any]:
        """The job in GitHub's `job` shape."""
        with self._lock:
            return self._job_json(self._jobs[job_id])

    def runners(self, installation_id: int) -> list[dict[str, Any]]:
        """The installation's registered runners in GitHub's `runner` shape, by id."""
        with self._lock:
            return [
                self._runner_json(r)
                for r in sorted(self._runners.values(), key=lambda r: r.id)
                if r.installation_id == installation_id
            ]

    def rate_limit(
        self, installation_id: int, reset_in: float | None = 60.0, retry_after: int | None = None
    ) -> None:
        """Rate-limit every call made with the installation's tokens from now on.

        403 with x-ratelimit-remaining 0 and the reset (primary) until `reset_in` seconds of
        `clock` have passed; with `retry_after`, 429 with retry-after instead (secondary).
        Both None: 403 that says nothing usable about when, until `clear_rate_limit`.
        """
        with self._lock:
            now = self.clock()
            if reset_in is not None:
                until: float | None = now + reset_in
            elif retry_after is not None:
                until = now + retry_after
            else:
                until = None
            self._limits[installation_id] = _Limit(until=until, retry_after=retry_after)

    def clear_rate_limit(self, installation_id: int) -> None:
        with self._lock:
            self._limits.pop(installation_id, None)

    def set_delivery(
        self,
        drop: bool = False,
        duplicate: bool = False,
        reorder: bool = False,
        delay: float = 0.0,
        *,
        early_progress: bool = False,
        queued_lag: float = 0.0,
        new_ids: bool = False,
    ) -> None:
        """How deliveries made from now on behave.

        drop: record each as attempted with status_code None and send nothing. duplicate:
        send each twice, back to back and at once (a `queued` copy lands while the job is
        still queued), with the same X-GitHub-Delivery (a redelivery); with new_ids the
        second copy has its own X-GitHub-Delivery instead (the same event sent again, which
        deduplicating on the delivery id cannot catch). reorder: hold a job's deliveries
        and send them newest first once it completes (so `completed` arrives first).
        early_progress: hold a job's `queued` until its `in_progress` is sent, then send it
        `queued_lag` seconds (real time) after that, so `in_progress` arrives first and
        `queued` late, while the job runs or after it (a job cancelled while queued sends
        it after `completed`); the other deliveries go out as they happen. reorder, when
        also on, holds whatever early_progress lets go and ignores the lag.
        delay: wait this many seconds (real time, it stands for latency) before sending.
        """
        with self._lock:
            self._delivery_mode = {
                "drop": bool(drop),
                "duplicate": bool(duplicate),
                "new_ids": bool(new_ids),
                "reorder": bool(reorder),
                "early_progress": bool(early_progress),
                "queued_lag": max(0.0, float(queued_lag)),
                "delay": max(0.0, float(delay)),
            }

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        """Every delivery attempted: id, event, action, job_id, status_code (None if dropped)."""
        with self._lock:
            return [dict(d) for d in self._deliveries]

    @property
    def calls(self) -> list[tuple[str, str, int | None]]:
        """GitHub API calls made: (method, path, installation id of the token or None)."""
        with self._lock:
            return list(self._calls)

    def expire_tokens(self) -> None:
        """Every installation token issued so far stops working (401 Bad credentials)."""
        with self._lock:
            for token in self._tokens.values():
                token.revoked = True

    def wait_deliveries(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least `count` deliveries were attempted; returns them."""
        with self._lock:
            if not self._changed.wait_for(lambda: len(self._deliveries) >= count, timeout):
                got = len(self._deliveries)
                raise TimeoutError(f"{got} of {count} deliveries after {timeout}s")
            return [dict(d) for d in self._deliveries]

    def wait_job(self, job_id: int, status: str, timeout: float = 5.0) -> dict[str, Any]:
        """Block until the job reaches `status`; returns it."""
        with self._lock:
            if not self._changed.wait_for(lambda: self._jobs[job_id].status == status, timeout):
                raise TimeoutError(f"job {job_id} is {self._jobs[job_id].status}, not {status}")
            return self._job_json(self._jobs[job_id])

    # ---- HTTP dispatch -----------------------------------------------------------------

    def _dispatch(self, method: str, raw_path: str, headers: Any, raw: bytes) -> _Response:
        parts = urllib.parse.urlsplit(raw_path)
        req = _Request(
            method=method.upper(),
            path=parts.path,
            query=urllib.parse.parse_qs(parts.query, keep_blank_values=True),
            headers=headers,
            raw_body=raw,
        )
        try:
            if req.path.startswith("/_fake/"):
                return self._control(req)
            if req.path.startswith("/_runner/"):
                return self._runner_protocol(req)
            return self._github(req)
        except _Error as exc:
            return _Response(exc.status, exc.body(), exc.headers)

    def _github(self, req: _Request) -> _Response:
        route = self._match(req)
        with self._lock:
            try:
                if route is None:
                    raise _Error(404, "Not Found")
                kind, handler = route
                if kind == "jwt":
                    self._check_jwt(req)
                elif kind == "token":
                    self._check_token(req)
                    self._check_rate(req)
                else:
                    self._optional_auth(req)
                if req.path != "/rate_limit":  # GitHub does not count /rate_limit itself
                    self._quota(req.principal).used += 1
                response = handler(req)
            except _Error as exc:
                response = _Response(exc.status, exc.body(), dict(exc.headers))
            finally:
                self._calls.append((req.method, req.path, req.installation_id))
            self._add_rate_headers(response, req.principal)
            response.headers.setdefault("X-GitHub-Media-Type", "github.v3; format=json")
            response.headers.setdefault("X-GitHub-Api-Version-Selected", "2022-11-28")
            response.headers.setdefault("X-GitHub-Request-Id", uuid.uuid4().hex[:20].upper())
            return response

    def _match(self, req: _Request) -> tuple[str, Callable[[_Request], _Response]] | None:
        for method, pattern, kind, handler in self._routes:
            match = pattern.fullmatch(req.path)
            if match and method == req.method:
                req.params = match.groupdict()
                return kind, handler
        return None

    def _github_routes(self) -> list[_Route]:
        table: list[tuple[str, str, str, Callable[[_Request], _Response]]] = [
            ("GET", "/app", "jwt", self._get_app),
            ("GET", "/app/installations", "jwt", self._list_installations),
            ("GET", "/app/installations/{installation_id}", "jwt", self._get_installation),
            (
                "POST",
                "/app/installations/{installation_id}/access_tokens",
                "jwt",
                self._create_token,
            ),
            ("GET", "/orgs/{org}/installation", "jwt", self._get_org_installation),
            ("GET", "/repos/{owner}/{repo}/installation", "jwt", self._get_repo_installation),
            ("GET", "/installation/repositories", "token", self._list_repositories),
            ("GET", "/rate_limit", "any", self._get_rate_limit),
            ("GET", "/orgs/{org}/actions/runner-groups", "token", self._list_runner_groups),
        ]
        for prefix in ("/orgs/{org}", "/repos/{owner}/{repo}"):
            runners = f"{prefix}/actions/runners"
            table += [
                ("POST", f"{runners}/generate-jitconfig", "token", self._generate_jitconfig),
                ("POST", f"{runners}/registration-token", "token", self._registration_token),
                ("POST", f"{runners}/remove-token", "token", self._registration_token),
                ("GET", runners, "token", self._list_runners),
                ("GET", f"{runners}/{{runner_id}}", "token", self._get_runner),
                ("DELETE", f"{runners}/{{runner_id}}", "token", self._delete_runner),
            ]
        table.append(
            # Only the org variant is in the spec subset Zoomies uses.
            (
                "GET",
                "/orgs/{org}/actions/runners/{runner_id}/labels",
                "token",
                self._get_runner_labels,
            )
        )
        runs = "/repos/{owner}/{repo}/actions/runs"
        table += [
            ("GET", runs, "token", self._list_runs),
            ("GET", f"{runs}/{{run_id}}", "token", self._get_run),
            ("GET", f"{runs}/{{run_id}}/jobs", "token", self._list_run_jobs),
            ("GET", "/repos/{owner}/{repo}/actions/jobs/{job_id}", "token", self._get_job),
        ]
        compiled: list[_Route] = []
        for method, template, kind, handler in table:
            regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template))
            compiled.append((method, re.compile(regex), kind, handler))
        return compiled

    # ---- authentication and rate limits ------------------------------------------------

    def _credentials(self, req: _Request) -> tuple[str, str]:
        scheme, _, value = (req.headers.get("Authorization") or "").strip().partition(" ")
        return scheme.lower(), value.strip()

    def _check_jwt(self, req: _Request) -> None:
        scheme, value = self._credentials(req)
        if scheme != "bearer" or value.count(".") != 2:
            raise _Error(401, "A JSON web token could not be decoded")
        try:
            claims = jwt.decode(
                value,
                self._public_key,
                algorithms=["RS256"],
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
            )
        except jwt.PyJWTError:
            raise _Error(401, "A JSON web token could not be decoded") from None
        now = self.clock()
        iat, exp, iss = claims.get("iat"), claims.get("exp"), claims.get("iss")
        if str(iss) not in (str(self.app_id), self.client_id):
            raise _Error(401, "'Issuer' claim ('iss') must be an Integer")
        if not isinstance(iat, int | float) or isinstance(iat, bool) or iat > now + JWT_IAT_LEEWAY:
            raise _Error(
                401,
                "'Issued at' claim ('iat') must be an Integer representing the time that the "
                "assertion was issued",
            )
        if not isinstance(exp, int | float) or isinstance(exp, bool) or exp <= now:
            raise _Error(
                401,
                "'Expiration time' claim ('exp') must be a numeric value representing the future "
                "time at which the assertion expires",
            )
        if exp - iat > JWT_MAX_LIFETIME or exp > now + JWT_MAX_LIFETIME:
            raise _Error(401, "'Expiration time' claim ('exp') is too far in the future")
        req.principal = ("app",)

    def _check_token(self, req: _Request) -> None:
        scheme, value = self._credentials(req)
        if not value or scheme not in ("token", "bearer"):
            raise _Error(401, "Requires authentication")
        token = self._tokens.get(value)
        if token is None or token.revoked or token.expires_at <= self.clock():
            raise _Error(401, "Bad credentials")
        req.token = token
        req.installation_id = token.installation_id
        req.principal = ("installation", token.installation_id)

    def _optional_auth(self, req: _Request) -> None:
        scheme, value = self._credentials(req)
        if not value:
            return
        if value.count(".") == 2:
            self._check_jwt(req)
        else:
            self._check_token(req)

    def _active_limit(self, installation_id: int | None) -> _Limit | None:
        if installation_id is None:
            return None
        limit = self._limits.get(installation_id)
        if limit is not None and limit.until is not None and self.clock() >= limit.until:
            del self._limits[installation_id]  # the window has passed on the fake's clock
            return None
        return limit

    def _check_rate(self, req: _Request) -> None:
        inst_id = req.installation_id
        limit = self._active_limit(inst_id)
        quota = self._quota(("installation", inst_id))
        if limit is not None and limit.retry_after is not None:
            raise _Error(
                429,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you "
                "try again.",
                headers={"Retry-After": str(int(limit.retry_after))},
                documentation_url=SECONDARY_DOCS,
            )
        if limit is not None and limit.until is None:
            # GitHub's "said nothing" answer: no retry-after, remaining not 0, no reset.
            raise _Error(
                403,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you "
                "try again.",
                documentation_url=SECONDARY_DOCS,
            )
        if limit is not None or quota.used >= quota.limit:
            raise _Error(
                403,
                f"API rate limit exceeded for installation ID {inst_id}.",
                documentation_url=RATE_DOCS,
            )

    def _quota(self, principal: tuple[Any, ...]) -> _Quota:
        now = self.clock()
        quota = self._quotas.get(principal)
        if quota is None or now >= quota.reset:
            limit = {"installation": INSTALLATION_LIMIT, "app": APP_LIMIT}.get(
                principal[0], ANON_LIMIT
            )
            quota = _Quota(limit=limit, reset=now + RATE_WINDOW)
            self._quotas[principal] = quota
        return quota

    def _rate_numbers(self, principal: tuple[Any, ...]) -> tuple[int, int, int, int | None]:
        """(limit, remaining, used, reset) as GitHub would report them for this caller.

        The reset is None while an installation is under a limit that gives no timing.
        """
        quota = self._quota(principal)
        limit = self._active_limit(principal[1]) if principal[0] == "installation" else None
        if limit is not None and limit.until is None and limit.retry_after is None:
            used = min(quota.used, quota.limit - 1)
            return quota.limit, quota.limit - used, used, None
        if limit is not None and limit.until is not None and limit.retry_after is None:
            return quota.limit, 0, quota.limit, math.ceil(limit.until)
        used = min(quota.used, quota.limit)
        return quota.limit, quota.limit - used, used, math.ceil(quota.reset)

    def _add_rate_headers(self, response: _Response, principal: tuple[Any, ...]) -> None:
        limit, remaining, used, reset = self._rate_numbers(principal)
        headers = {
            "x-ratelimit-limit": str(limit),
            "x-ratelimit-remaining": str(remaining),
            "x-ratelimit-used": str(used),
            "x-ratelimit-reset": str(reset),
            "x-ratelimit-resource": "core",
        }
        if reset is None:
            del headers["x-ratelimit-reset"]
        headers.update(response.headers)
        response.headers = headers

    # ---- scope helpers -----------------------------------------------------------------

    def _org_scope(self, req: _Request) -> _Installation:
        inst = self._installations.get(req.installation_id or -1)
        org = req.params["org"].lower()
        if inst is None or inst.account_type != "Organization" or inst.account.lower() != org:
            raise _Error(404, "Not Found")
        return inst

    def _repo_scope(self, req: _Request) -> _Repo:
        key = f"{req.params['owner']}/{req.params['repo']}".lower()
        repo = self._repos.get(key)
        token = req.token
        if (
            repo is None
            or token is None
            or repo.installation_id != token.installation_id
            or (token.repositories is not None and key not in token.repositories)
        ):
            raise _Error(404, "Not Found")
        return repo

    def _runner_scope(self, req: _Request) -> tuple[str, str]:
        if "org" in req.params:
            return ("org", self._org_scope(req).account.lower())
        return ("repo", self._repo_scope(req).full_name.lower())

    def _int_param(self, req: _Request, name: str) -> int:
        try:
            return int(req.params[name])
        except ValueError:
            raise _Error(404, "Not Found") from None

    def _paginate(self, req: _Request, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
        per_page = _positive_int(req.q("per_page"), 30)
        per_page = min(per_page, 100)
        page = _positive_int(req.q("page"), 1)
        last = max(1, math.ceil(len(items) / per_page))
        chunk = items[(page - 1) * per_page : page * per_page]

        def link(number: int, rel: str) -> str:
            params = {k: v[-1] for k, v in req.query.items()}
            params.update(per_page=str(per_page), page=str(number))
            return f'<{self.url}{req.path}?{urllib.parse.urlencode(params)}>; rel="{rel}"'

        links = []
        if page > 1:
            links.append(link(min(page - 1, last), "prev"))
        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links.append(link(1, "first"))
        return chunk, ({"Link": ", ".join(links)} if links else {})

    # ---- GitHub: the App and its installations -----------------------------------------

    def _get_app(self, req: _Request) -> _Response:
        owner = shapes.simple_user(self.url, self.url, "zoomies-dev", 7_000_001)
        body = {
            "id": self.app_id,
            "slug": self.app_slug,
            "client_id": self.client_id,
            "node_id": shapes.node_id("Integration", self.app_id),
            "owner": owner,
            "name": "Zoomies (fake)",
            "description": "Ephemeral self-hosted runners",
            "external_url": f"{self.url}/zoomies",
            "html_url": f"{self.url}/apps/{self.app_slug}",
            "created_at": iso(self._created_at),
            "updated_at": iso(self._created_at),
            "permissions": self._permissions("Organization"),
            "events": ["workflow_job"],
            "installations_count": len(self._installations),
        }
        return _Response(200, body)

    def _permissions(self, account_type: str) -> dict[str, str]:
        perms = {"actions": "read", "administration": "write", "metadata": "read"}
        if account_type == "Organization":
            perms["organization_self_hosted_runners"] = "write"
        return perms

    def _installation_json(self, inst: _Installation, *, listed: bool = False) -> dict[str, Any]:
        account = shapes.simple_user(
            self.url, self.url, inst.account, inst.account_id, inst.account_type
        )
        if listed:
            # GitHub's spec types this list's account as allOf[Simple User, Enterprise]
            # (NOTES.md section 6); these four extra keys make it validate and harm no client.
            account.update(
                name=inst.account,
                slug=inst.account.lower(),
                created_at=iso(inst.created_at),
                updated_at=iso(inst.created_at),
            )
        settings = (
            f"{self.url}/organizations/{inst.account}/settings/installations/{inst.id}"
            if inst.account_type == "Organization"
            else f"{self.url}/settings/installations/{inst.id}"
        )
        return {
            "id": inst.id,
            "account": account,
            "repository_selection": "selected",
            "access_tokens_url": f"{self.url}/app/installations/{inst.id}/access_tokens",
            "repositories_url": f"{self.url}/installation/repositories",
            "html_url": settings,
            "app_id": self.app_id,
            "client_id": self.client_id,
            "app_slug": self.app_slug,
            "target_id": inst.account_id,
            "target_type": inst.account_type,
            "permissions": self._permissions(inst.account_type),
            "events": ["workflow_job"],
            "created_at": iso(inst.created_at),
            "updated_at": iso(inst.created_at),
            "single_file_name": None,
            "has_multiple_single_files": False,
            "single_file_paths": [],
            "suspended_by": None,
            "suspended_at": None,
        }

    def _list_installations(self, req: _Request) -> _Response:
        items = [self._installation_json(i, listed=True) for i in self._installations.values()]
        chunk, headers = self._paginate(req, items)
        return _Response(200, chunk, headers)

    def _installation_by_param(self, req: _Request) -> _Installation:
        inst = self._installations.get(self._int_param(req, "installation_id"))
        if inst is None:
            raise _Error(404, "Not Found")
        return inst

    def _get_installation(self, req: _Request) -> _Response:
        return _Response(200, self._installation_json(self._installation_by_param(req)))

    def _get_org_installation(self, req: _Request) -> _Response:
        org = req.params["org"].lower()
        for inst in self._installations.values():
            if inst.account_type == "Organization" and inst.account.lower() == org:
                return _Response(200, self._installation_json(inst))
        raise _Error(404, "Not Found")

    def _get_repo_installation(self, req: _Request) -> _Response:
        repo = self._repos.get(f"{req.params['owner']}/{req.params['repo']}".lower())
        if repo is None:
            raise _Error(404, "Not Found")
        return _Response(200, self._installation_json(self._installations[repo.installation_id]))

    def _create_token(self, req: _Request) -> _Response:
        inst = self._installation_by_param(req)
        body = req.json(required=False)
        if not isinstance(body, dict):
            raise _Error(422, "Invalid request.\n\nThe body must be an object.")
        granted = self._permissions(inst.account_type)
        wanted = body.get("permissions")
        permissions = dict(granted)
        if wanted is not None:
            if not isinstance(wanted, dict) or any(
                granted.get(k) not in ("write", v) for k, v in wanted.items()
            ):
                raise _Error(422, "The permissions requested are not granted to this installation.")
            permissions = dict(wanted)
        narrowed: set[str] | None = None
        names, ids = body.get("repositories"), body.get("repository_ids")
        if names is not None or ids is not None:
            narrowed = set()
            by_name = {self._repos[r.lower()].name.lower(): r.lower() for r in inst.repositories}
            by_id = {self._repos[r.lower()].id: r.lower() for r in inst.repositories}
            for name in names or []:
                short = str(name).rsplit("/", 1)[-1].lower()
                if short not in by_name:
                    raise _Error(
                        422,
                        "There is at least one repository that does not exist or is not "
                        "accessible to the parent installation.",
                    )
                narrowed.add(by_name[short])
            for ident in ids or []:
                if ident not in by_id:
                    raise _Error(
                        422,
                        "There is at least one repository that does not exist or is not "
                        "accessible to the parent installation.",
                    )
                narrowed.add(by_id[ident])
        token = _Token(
            token="ghs_" + "".join(secrets.choice(_ALNUM) for _ in range(36)),
            installation_id=inst.id,
            expires_at=self.clock() + self.token_lifetime,
            repositories=narrowed,
            permissions=permissions,
        )
        self._tokens[token.token] = token
        out: dict[str, Any] = {
            "token": token.token,
            "expires_at": iso(token.expires_at),
            "permissions": permissions,
            "repository_selection": "selected",
        }
        if narrowed is not None:
            out["repositories"] = [self._repo_json(self._repos[k]) for k in sorted(narrowed)]
        return _Response(201, out)

    def _list_repositories(self, req: _Request) -> _Response:
        assert req.token is not None
        inst = self._installations[req.token.installation_id]
        repos = [
            self._repos[r.lower()]
            for r in inst.repositories
            if req.token.repositories is None or r.lower() in req.token.repositories
        ]
        chunk, headers = self._paginate(req, [self._repo_json(r) for r in repos])
        body = {
            "total_count": len(repos),
            "repositories": chunk,
            "repository_selection": "selected",
        }
        return _Response(200, body, headers)

    def _get_rate_limit(self, req: _Request) -> _Response:
        limit, remaining, used, maybe_reset = self._rate_numbers(req.principal)
        if maybe_reset is None:  # the "said nothing" limit: the body still needs a number
            maybe_reset = math.ceil(self._quota(req.principal).reset)
        reset = maybe_reset
        core = {"limit": limit, "remaining": remaining, "reset": reset, "used": used}
        later = int(self.clock()) + 60
        resources = {
            "core": core,
            "search": {"limit": 30, "remaining": 30, "reset": later, "used": 0},
            "graphql": {"limit": 5000, "remaining": 5000, "reset": reset, "used": 0},
            "integration_manifest": {"limit": 5000, "remaining": 5000, "reset": reset, "used": 0},
            "actions_runner_registration": {
                "limit": 10000,
                "remaining": 10000,
                "reset": reset,
                "used": 0,
            },
        }
        return _Response(200, {"resources": resources, "rate": core})

    # ---- GitHub: runners ---------------------------------------------------------------

    def _runner_online(self, runner: _Runner) -> bool:
        if runner.session is None:
            return False
        if runner.job_id is not None or runner.polling > 0:
            return True
        seen = runner.last_seen
        return seen is not None and self.clock() - seen <= self.offline_after

    def _runner_json(self, runner: _Runner) -> dict[str, Any]:
        return {
            "id": runner.id,
            "name": runner.name,
            "os": runner.os,
            "status": "online" if self._runner_online(runner) else "offline",
            "busy": runner.job_id is not None,
            "ephemeral": runner.ephemeral,
            "runner_group_id": DEFAULT_GROUP_ID,
            "version": runner.version,
            "labels": [dict(label) for label in runner.labels],
        }

    def _label_id(self, name: str) -> int:
        return self._label_ids.setdefault(name.lower(), next(self._ids["label"]))

    def _generate_jitconfig(self, req: _Request) -> _Response:
        scope = self._runner_scope(req)
        body = req.json()
        problems = _jit_problems(body)
        if problems:
            raise _Error(422, "Invalid request.\n\n" + " ".join(problems), errors=problems)
        if body["runner_group_id"] != DEFAULT_GROUP_ID:
            raise _Error(404, "Not Found")
        name = body["name"]
        if any(r.scope == scope and r.name.lower() == name.lower() for r in self._runners.values()):
            raise _Error(409, f"Already exists - A runner with the name {name} already exists.")
        runner = _Runner(
            id=next(self._ids["runner"]),
            name=name,
            installation_id=req.installation_id or 0,
            scope=scope,
            labels=shapes.runner_labels(body["labels"], self._label_id),
            secret=secrets.token_urlsafe(24),
        )
        self._runners[runner.id] = runner
        self._changed.notify_all()
        encoded = self._encode_jit_config(runner, body.get("work_folder") or "_work")
        return _Response(201, {"runner": self._runner_json(runner), "encoded_jit_config": encoded})

    def _encode_jit_config(self, runner: _Runner, work_folder: str) -> str:
        """NOTES.md section 4: base64 of a JSON object of file name -> base64 file content."""
        owner = runner.scope[1]
        settings = {
            "agentId": runner.id,
            "runnerId": runner.id,
            "agentName": runner.name,
            "poolId": DEFAULT_GROUP_ID,
            "poolName": DEFAULT_GROUP_NAME,
            "serverUrl": self.url,
            "gitHubUrl": f"{self.url}/{owner}",
            "workFolder": work_folder,
            "ephemeral": True,
            "disableUpdate": True,
        }
        credentials = {
            "scheme": "OAuth",
            "data": {
                "clientId": str(uuid.uuid4()),
                "authorizationUrl": f"{self.url}/_runner/sessions",
                "requireFipsCryptography": "False",
                "secret": runner.secret,
            },
        }
        files = {
            ".runner": _b64(json.dumps(settings, indent=2).encode()),
            ".credentials": _b64(json.dumps(credentials, indent=2).encode()),
        }
        return _b64(json.dumps(files).encode())

    def _registration_token(self, req: _Request) -> _Response:
        self._runner_scope(req)
        token = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(29))
        # Registration and remove tokens live one hour (spec description).
        return _Response(201, {"token": token, "expires_at": iso(self.clock() + 3600)})

    def _scoped_runners(self, req: _Request) -> list[_Runner]:
        scope = self._runner_scope(req)
        return [r for r in sorted(self._runners.values(), key=lambda r: r.id) if r.scope == scope]

    def _list_runners(self, req: _Request) -> _Response:
        runners = self._scoped_runners(req)
        name = req.q("name")
        if name is not None:
            runners = [r for r in runners if r.name == name]
        chunk, headers = self._paginate(req, [self._runner_json(r) for r in runners])
        return _Response(200, {"total_count": len(runners), "runners": chunk}, headers)

    def _scoped_runner(self, req: _Request) -> _Runner:
        ident = self._int_param(req, "runner_id")
        for runner in self._scoped_runners(req):
            if runner.id == ident:
                return runner
        raise _Error(404, "Not Found")

    def _get_runner(self, req: _Request) -> _Response:
        return _Response(200, self._runner_json(self._scoped_runner(req)))

    def _get_runner_labels(self, req: _Request) -> _Response:
        labels = self._scoped_runner(req).labels
        return _Response(200, {"total_count": len(labels), "labels": [dict(x) for x in labels]})

    def _delete_runner(self, req: _Request) -> _Response:
        runner = self._scoped_runner(req)
        if runner.job_id is not None:
            raise _Error(422, f'Bad request - Runner "{runner.name}" is still running a job')
        self._remove_runner(runner)
        return _Response(204)

    def _remove_runner(self, runner: _Runner) -> None:
        self._runners.pop(runner.id, None)
        if runner.session is not None:
            self._sessions.pop(runner.session, None)
            runner.session = None
        self._changed.notify_all()  # wakes its long-poll, which then answers 404

    def _list_runner_groups(self, req: _Request) -> _Response:
        inst = self._org_scope(req)
        chunk, headers = self._paginate(req, [shapes.runner_group(self.url, inst.account)])
        return _Response(200, {"total_count": 1, "runner_groups": chunk}, headers)

    # ---- GitHub: workflow runs and jobs ------------------------------------------------

    def _repo_json(self, repo: _Repo) -> dict[str, Any]:
        inst = self._installations[repo.installation_id]
        owner = shapes.simple_user(
            self.url, self.url, inst.account, inst.account_id, inst.account_type
        )
        return shapes.repository(
            self.url,
            self.url,
            ident=repo.id,
            name=repo.name,
            owner=owner,
            created_at=repo.created_at,
        )

    def _run_status(self, run: _Run) -> tuple[str, str | None]:
        jobs = [self._jobs[j] for j in run.job_ids]
        if all(j.status == "completed" for j in jobs):
            conclusions = [j.conclusion for j in jobs]
            for worst in ("failure", "cancelled", "timed_out", "action_required"):
                if worst in conclusions:
                    return "completed", worst
            return "completed", conclusions[0]
        if any(j.status != "queued" for j in jobs):
            return "in_progress", None
        return "queued", None

    def _run_json(self, run: _Run) -> dict[str, Any]:
        repo = self._repos[run.repo.lower()]
        repo_json = self._repo_json(repo)
        actor = self._sender()
        status, conclusion = self._run_status(run)
        api = f"{self.url}/repos/{run.repo}/actions/runs/{run.id}"
        workflow_id = 100_000 + sum(ord(c) for c in run.name)
        return {
            "id": run.id,
            "name": run.name,
            "node_id": shapes.node_id("WorkflowRun", run.id),
            "check_suite_id": run.id + 1,
            "check_suite_node_id": shapes.node_id("CheckSuite", run.id + 1),
            "head_branch": "main",
            "head_sha": run.head_sha,
            "path": ".github/workflows/ci.yml",
            "run_number": run.run_number,
            "event": "push",
            "display_title": f"{run.name} #{run.run_number}",
            "status": status,
            "conclusion": conclusion,
            "workflow_id": workflow_id,
            "url": api,
            "html_url": f"{self.url}/{run.repo}/actions/runs/{run.id}",
            "pull_requests": [],
            "created_at": iso(run.created_at),
            "updated_at": iso(run.updated_at),
            "actor": actor,
            "run_attempt": 1,
            "referenced_workflows": [],
            "run_started_at": iso(run.created_at),
            "triggering_actor": actor,
            "jobs_url": f"{api}/jobs",
            "logs_url": f"{api}/logs",
            "check_suite_url": f"{self.url}/repos/{run.repo}/check-suites/{run.id + 1}",
            "artifacts_url": f"{api}/artifacts",
            "cancel_url": f"{api}/cancel",
            "rerun_url": f"{api}/rerun",
            "previous_attempt_url": None,
            "workflow_url": f"{self.url}/repos/{run.repo}/actions/workflows/{workflow_id}",
            "head_commit": {
                "id": run.head_sha,
                "tree_id": hashlib.sha1(run.head_sha.encode()).hexdigest(),
                "message": "Update the fake",
                "timestamp": iso(run.created_at),
                "author": {"name": "Mona Lisa", "email": "monalisa@example.com"},
                "committer": {"name": "GitHub", "email": "noreply@github.com"},
            },
            "repository": repo_json,
            "head_repository": repo_json,
        }

    def _job_json(self, job: _Job) -> dict[str, Any]:
        run = self._runs[job.run_id]
        repo_api = f"{self.url}/repos/{job.repo}"
        ran = job.runner_id is not None
        return {
            "id": job.id,
            "run_id": job.run_id,
            "workflow_name": run.name,
            "head_branch": "main",
            "run_url": f"{repo_api}/actions/runs/{job.run_id}",
            "run_attempt": 1,
            "node_id": shapes.node_id("CheckRun", job.id),
            "head_sha": run.head_sha,
            "url": f"{repo_api}/actions/jobs/{job.id}",
            "html_url": f"{self.url}/{job.repo}/actions/runs/{job.run_id}/job/{job.id}",
            "status": job.status,
            "conclusion": job.conclusion,
            "created_at": iso(job.created_at),
            # GitHub reports a queued job's started_at as its creation time.
            "started_at": iso(job.started_at if job.started_at is not None else job.created_at),
            "completed_at": iso(job.completed_at),
            "name": job.name,
            "steps": shapes.job_steps(
                job.status if ran else "queued",
                job.conclusion,
                job.started_at or job.created_at,
                job.completed_at,
            ),
            "check_run_url": f"{repo_api}/check-runs/{job.id}",
            "labels": list(job.labels),
            "runner_id": job.runner_id,
            "runner_name": job.runner_name,
            "runner_group_id": DEFAULT_GROUP_ID if ran else None,
            "runner_group_name": DEFAULT_GROUP_NAME if ran else None,
        }

    def _list_runs(self, req: _Request) -> _Response:
        repo = self._repo_scope(req)
        wanted = req.q("status")
        runs = sorted(
            (r for r in self._runs.values() if r.repo == repo.full_name),
            key=lambda r: r.id,
            reverse=True,
        )
        if wanted:
            runs = [r for r in runs if wanted in self._run_status(r)]
        runs = runs[:1000] if wanted else runs  # GitHub caps filtered searches at 1,000
        chunk, headers = self._paginate(req, runs)
        body = {"total_count": len(runs), "workflow_runs": [self._run_json(r) for r in chunk]}
        return _Response(200, body, headers)

    def _scoped_run(self, req: _Request) -> _Run:
        repo = self._repo_scope(req)
        run = self._runs.get(self._int_param(req, "run_id"))
        if run is None or run.repo != repo.full_name:
            raise _Error(404, "Not Found")
        return run

    def _get_run(self, req: _Request) -> _Response:
        return _Response(200, self._run_json(self._scoped_run(req)))

    def _list_run_jobs(self, req: _Request) -> _Response:
        run = self._scoped_run(req)
        chunk, headers = self._paginate(req, [self._jobs[j] for j in run.job_ids])
        body = {"total_count": len(run.job_ids), "jobs": [self._job_json(j) for j in chunk]}
        return _Response(200, body, headers)

    def _get_job(self, req: _Request) -> _Response:
        repo = self._repo_scope(req)
        job = self._jobs.get(self._int_param(req, "job_id"))
        if job is None or job.repo != repo.full_name:
            raise _Error(404, "Not Found")
        return _Response(200, self._job_json(job))

    # ---- assignment --------------------------------------------------------------------

    def _can_take(self, runner: _Runner, job: _Job) -> bool:
        if runner.installation_id != job.installation_id or runner.job_id is not None:
            return False
        kind, where = runner.scope
        # An org runner serves the org's repositories; a repo runner only its own repository.
        if kind == "org" and job.repo.split("/")[0].lower() != where:
            return False
        if kind == "repo" and job.repo.lower() != where:
            return False
        names = {label["name"].lower() for label in runner.labels}
        return all(label.lower() in names for label in job.labels)

    def _assign_job(self, job: _Job) -> None:
        """Give a queued job to the longest-waiting online idle runner that matches."""
        candidates = [
            r for r in self._runners.values() if self._runner_online(r) and self._can_take(r, job)
        ]
        if candidates:
            self._start(job, min(candidates, key=lambda r: (r.waiting_since, r.id)))

    def _assign_runner(self, runner: _Runner) -> None:
        """Give an idle runner the oldest queued job it can take."""
        if not self._runner_online(runner) or runner.job_id is not None:
            return
        for job_id in self._queued:
            job = self._jobs[job_id]
            if self._can_take(runner, job):
                self._start(job, runner)
                return

    def _start(self, job: _Job, runner: _Runner) -> None:
        self._queued.pop(job.id, None)
        now = self.clock()
        job.status = "in_progress"
        job.started_at = now
        job.runner_id = runner.id
        job.runner_name = runner.name
        runner.job_id = job.id
        runner.job_handed = False
        self._runs[job.run_id].updated_at = now
        self._emit(job, "in_progress")
        self._changed.notify_all()

    def _finish(self, job: _Job, conclusion: str) -> None:
        now = self.clock()
        job.status = "completed"
        job.conclusion = conclusion
        job.completed_at = now
        self._runs[job.run_id].updated_at = now
        self._emit(job, "completed")
        self._changed.notify_all()

    # ---- the runner protocol -----------------------------------------------------------

    def _runner_protocol(self, req: _Request) -> _Response:
        path, method = req.path, req.method
        if path == "/_runner/sessions" and method == "POST":
            return self._open_session(req)
        if path == "/_runner/sessions" and method == "DELETE":
            with self._lock:
                runner = self._session_runner(req)
                self._sessions.pop(runner.session or "", None)
                runner.session = None
                self._changed.notify_all()
            return _Response(204)
        if path == "/_runner/jobs" and method == "GET":
            return self._poll(req)
        match = re.fullmatch(r"/_runner/jobs/(\d+)/complete", path)
        if match and method == "POST":
            return self._complete(req, int(match.group(1)))
        raise _Error(404, "Not Found")

    def _open_session(self, req: _Request) -> _Response:
        body = req.json()
        with self._lock:
            ident = body.get("runner_id") if isinstance(body, dict) else None
            runner = self._runners.get(ident) if isinstance(ident, int) else None
            if runner is None:
                raise _Error(404, "Runner not found: it was removed or never registered")
            if not hmac.compare_digest(str(body.get("secret", "")), runner.secret):
                raise _Error(401, "Bad credentials")
            if runner.session_used:
                # A JIT config is single-use: its runner may open one session, ever.
                raise _Error(409, "This JIT configuration has already been used")
            runner.session = secrets.token_urlsafe(24)
            runner.session_used = True
            runner.os = str(body.get("os") or "linux")
            runner.version = str(body.get("version") or "") or None
            runner.last_seen = self.clock()
            runner.waiting_since = time.monotonic()
            self._sessions[runner.session] = runner.id
            self._assign_runner(runner)
            self._changed.notify_all()
            return _Response(201, {"session": runner.session, "runner": self._runner_json(runner)})

    def _session_runner(self, req: _Request) -> _Runner:
        scheme, value = self._credentials(req)
        runner_id = self._sessions.get(value) if scheme == "bearer" else None
        runner = self._runners.get(runner_id) if runner_id is not None else None
        if runner is None:
            raise _Error(404, "Session not found: the runner was removed or its session closed")
        return runner

    def _poll(self, req: _Request) -> _Response:
        try:
            wait = min(max(float(req.q("wait") or 0), 0.0), LONG_POLL_MAX)
        except ValueError:
            wait = 0.0
        deadline = time.monotonic() + wait
        with self._lock:
            runner = self._session_runner(req)
            runner.polling += 1
            try:
                self._assign_runner(runner)
                while True:
                    if self._runners.get(runner.id) is not runner or runner.session is None:
                        raise _Error(404, "Session not found: the runner was removed")
                    if runner.job_id is not None and not runner.job_handed:
                        runner.job_handed = True
                        return _Response(200, {"job": self._job_message(self._jobs[runner.job_id])})
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stopping:
                        return _Response(204)
                    self._changed.wait(left)
            finally:
                runner.polling -= 1
                runner.last_seen = self.clock()

    def _job_message(self, job: _Job) -> dict[str, Any]:
        return {
            "id": job.id,
            "run_id": job.run_id,
            "repository": job.repo,
            "name": job.name,
            "labels": list(job.labels),
            "duration": job.duration,
            "conclusion": job.wanted_conclusion,
        }

    def _complete(self, req: _Request, job_id: int) -> _Response:
        body = req.json()
        conclusion = body.get("conclusion") if isinstance(body, dict) else None
        if conclusion not in CONCLUSIONS:
            raise _Error(422, f"conclusion must be one of {', '.join(CONCLUSIONS)}")
        with self._lock:
            runner = self._session_runner(req)
            if runner.job_id != job_id:
                raise _Error(409, f"runner {runner.name} is not running job {job_id}")
            job = self._jobs[job_id]
            self._finish(job, conclusion)
            runner.job_id = None
            runner.last_seen = self.clock()
            runner.waiting_since = time.monotonic()
            if runner.ephemeral:
                # GitHub de-registers an ephemeral runner once its job is done.
                self._remove_runner(runner)
            else:
                self._assign_runner(runner)
            return _Response(200, {"runner_removed": runner.ephemeral})

    # ---- webhook deliveries ------------------------------------------------------------

    def _sender(self) -> dict[str, Any]:
        return shapes.simple_user(self.url, self.url, "monalisa", 7_000_002)

    def _emit(self, job: _Job, action: str) -> None:
        """Build one `workflow_job` delivery now and route it through the delivery modes."""
        inst = self._installations[job.installation_id]
        payload: dict[str, Any] = {
            "action": action,
            "workflow_job": self._job_json(job),
            "repository": self._repo_json(self._repos[job.repo.lower()]),
        }
        if inst.account_type == "Organization":
            payload["organization"] = shapes.organization_simple(
                self.url, self.url, inst.account, inst.account_id
            )
        payload["sender"] = self._sender()
        payload["installation"] = {
            "id": inst.id,
            "node_id": shapes.node_id("Installation", inst.id),
        }
        body = json.dumps(payload, separators=(",", ":")).encode()
        delivery_id = str(uuid.uuid4())
        headers = {
            "Accept": "*/*",
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/9f2c1d7",
            "X-GitHub-Event": "workflow_job",
            "X-GitHub-Delivery": delivery_id,
            "X-GitHub-Hook-ID": str(self.hook_id),
            "X-GitHub-Hook-Installation-Target-ID": str(self.app_id),
            "X-GitHub-Hook-Installation-Target-Type": "integration",
        }
        if self.webhook_secret:
            key = self.webhook_secret.encode()
            headers["X-Hub-Signature"] = "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest()
            headers["X-Hub-Signature-256"] = (
                "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
            )
        mode = self._delivery_mode
        if self.webhook_url is None or mode["drop"]:
            self._record(delivery_id, job.id, action, None, "dropped")
            return
        copies = [_Outgoing(0.0, 0, delivery_id, job.id, action, self.webhook_url, body, headers)]
        if mode["duplicate"]:
            again_id = str(uuid.uuid4()) if mode["new_ids"] else delivery_id
            again = {**headers, "X-GitHub-Delivery": again_id}
            copies.append(
                _Outgoing(0.0, 0, again_id, job.id, action, self.webhook_url, body, again)
            )
        if action == "queued" and job.status == "queued" and mode["early_progress"]:
            # Its in_progress (or, for a job cancelled while queued, its completed) lets it go.
            for item in copies:
                item.lag = mode["queued_lag"]
            self._late.setdefault(job.id, []).extend(copies)
            return
        if action != "queued" and job.id in self._late:
            # Held by early_progress even if the mode was switched off since.
            copies += self._late.pop(job.id)
        if mode["reorder"] or job.id in self._held:
            held = self._held.setdefault(job.id, [])
            held.extend(copies)
            if action != "completed":
                return
            # Release the job's deliveries newest first, so `completed` arrives before the rest.
            copies = list(reversed(self._held.pop(job.id)))
            for item in copies:
                item.lag = 0.0
        due = time.monotonic() + mode["delay"]
        with self._outbox_cv:
            for item in copies:
                item.due, item.seq = due + item.lag, next(self._outbox_seq)
                heapq.heappush(self._outbox, item)
            self._outbox_cv.notify_all()

    def _record(
        self, delivery_id: str, job_id: int, action: str, status: int | None, error: str | None
    ) -> None:
        with self._lock:
            self._deliveries.append(
                {
                    "id": delivery_id,
                    "event": "workflow_job",
                    "action": action,
                    "job_id": job_id,
                    "status_code": status,
                    "error": error,
                }
            )
            self._changed.notify_all()

    def _send_loop(self) -> None:
        """The sender thread: POST each due delivery, once, never from a request handler."""
        while True:
            with self._outbox_cv:
                while not self._stopping:
                    if self._outbox and self._outbox[0].due <= time.monotonic():
                        break
                    wait = self._outbox[0].due - time.monotonic() if self._outbox else None
                    self._outbox_cv.wait(wait)
                if self._stopping:
                    return
                item = heapq.heappop(self._outbox)
            status, error = _post(item.url, item.body, item.headers)
            # GitHub records a failed delivery and does not retry it.
            self._record(item.delivery_id, item.job_id, item.action, status, error)

    # ---- /_fake control routes ---------------------------------------------------------

    def _control(self, req: _Request) -> _Response:
        path, method = req.path, req.method
        try:
            if path == "/_fake/installations" and method == "POST":
                body = _object(req)
                inst_id = self.add_installation(
                    account=str(body["account"]),
                    account_type=str(body.get("account_type", "Organization")),
                    repositories=list(body.get("repositories", [])),
                )
                return _Response(201, {"id": inst_id})
            if path == "/_fake/jobs" and method == "POST":
                body = _object(req)
                job_id = self.queue_job(
                    repo=str(body["repo"]),
                    labels=list(body["labels"]),
                    duration=float(body.get("duration", 0.0)),
                    conclusion=str(body.get("conclusion", "success")),
                    name=str(body.get("name", "build")),
                )
                return _Response(201, self.job(job_id))
            match = re.fullmatch(r"/_fake/jobs/(\d+)(/cancel)?", path)
            if match and method == "GET" and not match.group(2):
                return _Response(200, self.job(int(match.group(1))))
            if match and method == "POST" and match.group(2):
                return _Response(200, self.cancel_job(int(match.group(1))))
            if path == "/_fake/rate_limit" and method == "POST":
                body = _object(req)
                inst_id = int(body["installation_id"])
                if body.get("clear"):
                    self.clear_rate_limit(inst_id)
                else:
                    retry = body.get("retry_after")
                    self.rate_limit(
                        inst_id,
                        reset_in=body.get("reset_in", 60.0),
                        retry_after=None if retry is None else int(retry),
                    )
                return _Response(200, {"installation_id": inst_id})
            if path == "/_fake/delivery" and method == "POST":
                body = _object(req)
                self.set_delivery(
                    drop=bool(body.get("drop", False)),
                    duplicate=bool(body.get("duplicate", False)),
                    reorder=bool(body.get("reorder", False)),
                    delay=float(body.get("delay", 0.0)),
                    early_progress=bool(body.get("early_progress", False)),
                    queued_lag=float(body.get("queued_lag", 0.0)),
                    new_ids=bool(body.get("new_ids", False)),
                )
                with self._lock:
                    return _Response(200, dict(self._delivery_mode))
            if path == "/_fake/expire_tokens" and method == "POST":
                self.expire_tokens()
                return _Response(200, {})
            if path == "/_fake/deliveries" and method == "GET":
                return _Response(200, self.deliveries)
            if path == "/_fake/calls" and method == "GET":
                return _Response(200, [list(c) for c in self.calls])
            if path == "/_fake/runners" and method == "GET":
                return _Response(200, self.runners(int(req.q("installation_id") or 0)))
            if path == "/_fake/info" and method == "GET":
                return _Response(200, self.info())
        except KeyError as exc:
            raise _Error(404 if "jobs/" in path else 422, f"Unknown or missing {exc}") from None
        except (ValueError, TypeError) as exc:
            raise _Error(422, str(exc)) from None
        raise _Error(404, "Not Found")

    def info(self) -> dict[str, Any]:
        """The fake's identity and installations, for people and the management command."""
        with self._lock:
            return {
                "url": self.url,
                "app_id": self.app_id,
                "client_id": self.client_id,
                "webhook_url": self.webhook_url,
                "installations": [
                    {
                        "id": i.id,
                        "account": i.account,
                        "account_type": i.account_type,
                        "repositories": list(i.repositories),
                    }
                    for i in self._installations.values()
                ],
            }


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


def _jit_problems(body: Any) -> list[str]:
    """Why a generate-jitconfig body breaks GitHub's request schema (empty when it doesn't)."""
    if not isinstance(body, dict):
        return ["The body must be an object."]
    problems = []
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append('"name" is required and must be a non-empty string.')
    elif len(name) > RUNNER_NAME_MAX:
        problems.append(f'"name" must be at most {RUNNER_NAME_MAX} characters.')
    group = body.get("runner_group_id")
    if not isinstance(group, int) or isinstance(group, bool):
        problems.append('"runner_group_id" is required and must be an integer.')
    labels = body.get("labels")
    if (
        not isinstance(labels, list)
        or not 1 <= len(labels) <= 100
        or not all(isinstance(x, str) and x.strip() for x in labels)
    ):
        problems.append('"labels" must be an array of 1 to 100 non-empty strings.')
    if "work_folder" in body and not isinstance(body["work_folder"], str):
        problems.append('"work_folder" must be a string.')
    return problems


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str | None]:
    """POST one delivery with GitHub's 10 s timeout: (status or None, error or None)."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    conn = cls(parts.netloc, timeout=DELIVERY_TIMEOUT)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, None
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{exc.__class__.__name__}: {exc}"
    finally:
        conn.close()
