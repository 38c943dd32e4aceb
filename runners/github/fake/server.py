"""The fake GitHub: a real HTTP server speaking the slice of GitHub's REST API Zoomies uses.

It authenticates App JWTs and installation tokens, mints JIT runner configurations, hands
queued jobs to the fake runners (runner.py) that consume them, and sends the signed
`workflow_job` deliveries GitHub would send. Tests and people steer it through the Python
methods of FakeGitHub or the /_fake/ HTTP routes. Standard library plus PyJWT and
cryptography only: no Django, no Zoomies import, so it also runs on its own.

Conditional requests as GitHub answers them: every 200 to a GET carries an `ETag`, a GET
whose `If-None-Match` names the current one gets 304 with no body, and a 304 is not counted
against the caller's hourly quota (`quota_used`, and `answers` with each call's status).
A JIT runner gets exactly the labels in its `generate-jitconfig` body, and a job goes only
to a runner that has every label the job asks for.

`FakeGitHub` (here: construction, lifecycle, dispatch and the route table) is assembled from
one mixin per section: control.py (the Python and `/_fake/` control surface), auth.py
(JWTs, tokens, rate limits, conditional requests), app_api.py, runners_api.py and
runs_api.py (GitHub's routes), runner_protocol.py (assignment and `/_runner/`),
deliveries.py (webhooks), hooks_api.py (the App's webhook delivery log and redelivery);
core.py holds the records and the HTTP plumbing they share.

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
  new_ids, reorder, early_progress, queued_lag, delay, seed}` (drop, duplicate and reorder
  each a switch or a share from 0 to 1); `GET /_fake/delivery` (the modes and the faults
  made so far); `POST /_fake/expire_tokens`; `GET /_fake/deliveries`; `GET /_fake/calls`;
  `GET /_fake/runners?installation_id=N`; `GET /_fake/info`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import secrets
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from runners.github.fake.app_api import AppApiMixin
from runners.github.fake.auth import AuthMixin
from runners.github.fake.control import ControlMixin
from runners.github.fake.core import (
    DELIVERY_TIMEOUT,
    _Error,
    _Handler,
    _Installation,
    _Job,
    _Limit,
    _Outgoing,
    _Quota,
    _Repo,
    _Request,
    _Response,
    _Route,
    _Run,
    _Runner,
    _Server,
    _shared_key,
    _Token,
)
from runners.github.fake.deliveries import DeliveriesMixin
from runners.github.fake.hooks_api import HookDeliveriesApiMixin
from runners.github.fake.runner_protocol import RunnerProtocolMixin
from runners.github.fake.runners_api import RunnersApiMixin
from runners.github.fake.runs_api import RunsApiMixin


class FakeGitHub(
    ControlMixin,
    AuthMixin,
    AppApiMixin,
    RunnersApiMixin,
    RunsApiMixin,
    RunnerProtocolMixin,
    DeliveriesMixin,
    HookDeliveriesApiMixin,
):
    """A fake GitHub (API, App auth, runners, jobs and webhook deliveries) on 127.0.0.1.

    `start()` serves on a background thread and returns self; `url` is the API base URL
    (like https://api.github.com). Time-dependent behaviour (token and JWT expiry, rate-limit
    resets, runner liveness) reads `clock`, so a test can move it instead of sleeping;
    delivery `delay` is real time, as it stands for network latency.
    """

    def __init__(
        self,
        webhook_url: str | None = None,
        webhook_secret: str | None = "secret",  # noqa: S107  # the fake GitHub's test secret
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
        self.app_id = app_id if app_id is not None else random.randint(100_000, 999_999)  # noqa: S311  # an id for the fake, not a secret
        self.client_id = f"Iv23li{secrets.token_hex(7)}"
        self.app_slug = "zoomies-fake"
        self.hook_id = random.randint(400_000_000, 499_999_999)  # noqa: S311  # an id for the fake, not a secret
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
                "hook_delivery": 30_000_000_001,
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
        self._limits: dict[int | str, _Limit] = {}  # by installation id, and APP_KEY
        self._quotas: dict[tuple[Any, ...], _Quota] = {}
        self._calls: list[tuple[str, str, int | None]] = []
        self._answers: list[tuple[str, str, int | None, int]] = []
        self._deliveries: list[dict[str, Any]] = []
        # GitHub's record of each attempt (GET /app/hook/deliveries), oldest first.
        self._hook_deliveries: list[dict[str, Any]] = []
        self._delivery_mode: dict[str, Any] = {
            "drop": False,
            "duplicate": False,
            "new_ids": False,
            "reorder": False,
            "early_progress": False,
            "queued_lag": 0.0,
            "delay": 0.0,
            "concurrency": 1,
            "seed": None,
        }
        # The draws of the modes set to a share (set_delivery's seed makes them repeatable).
        self._delivery_rng = random.Random()  # noqa: S311  # a fault pattern, not a secret
        self._reorder_choice: dict[int, bool] = {}  # reorder at a share: drawn once per job
        self._faults = {"dropped": 0, "redeliveries_dropped": 0, "duplicated": 0}
        self._reordered_jobs: set[int] = set()
        self._held: dict[int, list[_Outgoing]] = {}  # reorder: all of a job's, until completed
        self._late: dict[int, list[_Outgoing]] = {}  # early_progress: its queued, until started
        self._outbox: list[_Outgoing] = []
        self._outbox_seq = itertools.count()
        self._outbox_cv = threading.Condition(threading.Lock())
        # Deliveries in flight at once, and the most allowed (set_delivery's concurrency);
        # both guarded by _outbox_cv, which is taken after _lock when both are.
        self._sending = 0
        self._concurrency = 1
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
                    self._check_rate(req)
                elif kind == "token":
                    self._check_token(req)
                    self._check_rate(req)
                else:
                    self._optional_auth(req)
                response = self._conditional(req, handler(req))
            except _Error as exc:
                response = _Response(exc.status, exc.body(), dict(exc.headers))
            finally:
                self._calls.append((req.method, req.path, req.installation_id))
            # GitHub does not count /rate_limit, nor a 304 to an authorised conditional request.
            if req.path != "/rate_limit" and response.status != 304:
                self._quota(req.principal).used += 1
            self._answers.append((req.method, req.path, req.installation_id, response.status))
            self._add_rate_headers(response, req.principal)
            response.headers.setdefault("X-GitHub-Media-Type", "github.v3; format=json")
            response.headers.setdefault("X-GitHub-Api-Version-Selected", "2022-11-28")
            response.headers.setdefault("X-GitHub-Request-Id", uuid.uuid4().hex[:20].upper())
            return response

    def _conditional(self, req: _Request, response: _Response) -> _Response:
        """An ETag on every 200 to a GET; 304 with no body when If-None-Match names it.

        The tag is a hash of what the answer says (body and Link), so it changes exactly
        when the answer does, as GitHub's does.
        """
        if req.method != "GET" or response.status != 200 or response.body is None:
            return response
        digest = hashlib.sha256(
            json.dumps(response.body, sort_keys=True).encode()
            + response.headers.get("Link", "").encode()
        ).hexdigest()
        etag = f'W/"{digest[:40]}"'
        response.headers["ETag"] = etag
        wanted = req.headers.get("If-None-Match") or ""
        tags = {tag.strip().removeprefix("W/") for tag in wanted.split(",") if tag.strip()}
        if etag.removeprefix("W/") in tags or "*" in tags:
            return _Response(304, None, {"ETag": etag})
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
            ("GET", "/app/hook/deliveries", "jwt", self._list_hook_deliveries),
            ("GET", "/app/hook/deliveries/{delivery_id}", "jwt", self._get_hook_delivery),
            (
                "POST",
                "/app/hook/deliveries/{delivery_id}/attempts",
                "jwt",
                self._redeliver_hook_delivery,
            ),
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
