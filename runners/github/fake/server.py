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

`FakeGitHub` (here: construction, lifecycle, dispatch and the route table) is the public
face; each of its other methods calls a plain function of a section module, and each route
names one. Those functions share one `FakeState` (state.py: the settings, the records and
the locks, and an `Observer` that bench/marks.py sets to time jobs), passed to every one
with, for a route, the request. The modules, each importing only those listed before it:
core.py (constants, request and response types, the HTTP plumbing) and state.py; auth.py
(JWTs, tokens, rate limits); app_api.py (the App's routes, and the scope checks, pagination
and shapes the others share); runners_api.py and runs_api.py (GitHub's runner and run
routes); deliveries.py (webhooks); runner_protocol.py (assignment and `/_runner/`);
hooks_api.py (the App's webhook delivery log and redelivery); manifests.py (the App manifest
flow: the new-App page and the code's conversion); control.py (the Python and
`/_fake/` control surface); this module.

Private routes (not GitHub's):

* Runner protocol, used by runner.py. `POST /_runner/sessions {runner_id, secret, os, arch,
  version}` -> 201 `{session, runner}` (401 bad secret, 404 unknown or removed runner, 409 the
  JIT config was already used); then with `Authorization: Bearer <session>`:
  `GET /_runner/jobs?wait=S` long-polls (max 50 s) -> 200 `{job: {id, run_id, repository,
  name, labels, duration, conclusion}}` or 204, 404 once the registration is gone;
  `POST /_runner/jobs/{id}/complete {conclusion}` -> 200 `{runner_removed}`;
  `DELETE /_runner/sessions` -> 204 (the runner goes offline). A runner held offline
  (`hold_runners_offline`) is answered 503 to every session it asks for: its registration
  stays offline while the runner program keeps trying, as a real one that cannot reach
  GitHub does.
* Control, JSON in and out: `POST /_fake/installations {account, account_type,
  repositories}` -> 201 `{id}`; `POST /_fake/jobs {repo, labels, duration, conclusion, name}`
  -> 201 job; `GET /_fake/jobs/{id}`; `POST /_fake/jobs/{id}/cancel`; `POST /_fake/rate_limit
  {installation_id, reset_in, retry_after, clear}`; `POST /_fake/delivery {drop, duplicate,
  new_ids, reorder, early_progress, queued_lag, delay, seed}` (drop, duplicate and reorder
  each a switch or a share from 0 to 1); `GET /_fake/delivery` (the modes and the faults
  made so far); `POST /_fake/expire_tokens`; `GET /_fake/deliveries`; `GET /_fake/calls`;
  `GET /_fake/runners?installation_id=N`; `POST /_fake/runners/offline {hold, names}`
  (names omitted: every runner); `POST /_fake/uninstall {installation_id}` (the App is
  removed from the account: `installation.deleted` is sent and its tokens are refused);
  `POST /_fake/event {event, payload}` (any signed delivery, such as one naming an
  installation the receiver does not know); `GET /_fake/info`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from runners.github.fake import (
    app_api,
    auth,
    control,
    deliveries,
    hooks_api,
    manifests,
    runner_protocol,
    runners_api,
    runs_api,
)
from runners.github.fake.core import (
    DELIVERY_TIMEOUT,
    Handler,
    HttpError,
    Request,
    RequestHandler,
    Response,
    Route,
    Server,
    shared_key,
)
from runners.github.fake.state import FakeState

T = TypeVar("T")


class _OnState(Generic[T]):
    """A FakeGitHub attribute kept on its state, where the sections read it: setting
    `fake.webhook_url` changes where the next delivery goes."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, fake: None, owner: type) -> _OnState[T]: ...
    @overload
    def __get__(self, fake: FakeGitHub, owner: type) -> T: ...
    def __get__(self, fake: FakeGitHub | None, owner: type) -> T | _OnState[T]:
        if fake is None:
            return self
        value: T = getattr(fake.state, self.name)
        return value

    def __set__(self, fake: FakeGitHub, value: T) -> None:
        setattr(fake.state, self.name, value)


class FakeGitHub:
    """A fake GitHub (API, App auth, runners, jobs and webhook deliveries) on 127.0.0.1.

    `start()` serves on a background thread and returns self; `url` is the API base URL
    (like https://api.github.com). Time-dependent behaviour (token and JWT expiry, rate-limit
    resets, runner liveness) reads `clock`, so a test can move it instead of sleeping;
    delivery `delay` is real time, as it stands for network latency.
    """

    url = _OnState[str]()
    webhook_url = _OnState[str | None]()
    webhook_secret = _OnState[str | None]()
    clock = _OnState[Callable[[], float]]()
    token_lifetime = _OnState[float]()
    offline_after = _OnState[float]()
    app_id = _OnState[int]()
    client_id = _OnState[str]()
    app_slug = _OnState[str]()
    hook_id = _OnState[int]()

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
        id_base: int = 0,
    ):
        """`id_base` moves the runner, run, job and hook delivery ids up by that much: a fake
        restarted beside the same database (the sandbox) must not hand out ids that name
        rows the last one's jobs left there (issue 21 item 4)."""
        chosen_app_id = app_id if app_id is not None else random.randint(100_000, 999_999)  # noqa: S311  # an id for the fake, not a secret
        client_id = f"Iv23li{secrets.token_hex(7)}"
        hook_id = random.randint(400_000_000, 499_999_999)  # noqa: S311  # an id for the fake, not a secret
        if private_key_pem is None:
            key = shared_key()
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
        self.state = FakeState(
            webhook_url=webhook_url,
            webhook_secret=webhook_secret,
            clock=clock,
            token_lifetime=token_lifetime,
            offline_after=offline_after,
            app_id=chosen_app_id,
            client_id=client_id,
            app_slug="zoomies-fake",
            hook_id=hook_id,
            public_key=key.public_key(),
            id_base=id_base,
        )
        # The manifest flow (manifests.py) hands out this key as the App's.
        self.state.private_key_pem = self.private_key_pem
        self._bind = (host, port)
        self._server: Server | None = None
        self._threads: list[threading.Thread] = []
        self._routes = _github_routes()

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeGitHub:
        """Bind, serve and send deliveries on background threads; returns self."""
        if self._server is not None:
            return self
        server = Server(self._bind, RequestHandler)
        server.dispatch = self._dispatch
        self._server = server
        host, port = server.server_address[:2]
        self.url = f"http://{host}:{port}"
        serve = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        sender = threading.Thread(target=deliveries.send_loop, args=(self.state,), daemon=True)
        self._threads = [serve, sender]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and sending; pending deliveries are discarded."""
        state = self.state
        with state.lock:
            state.stopping = True
            state.changed.notify_all()
        with state.outbox_cv:
            state.outbox_cv.notify_all()
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

    def _dispatch(self, method: str, raw_path: str, headers: Any, raw: bytes) -> Response:
        parts = urllib.parse.urlsplit(raw_path)
        req = Request(
            method=method.upper(),
            path=parts.path,
            query=urllib.parse.parse_qs(parts.query, keep_blank_values=True),
            headers=headers,
            raw_body=raw,
        )
        try:
            if req.path.startswith("/_fake/"):
                return control.control_route(self.state, req)
            if req.path.startswith("/_runner/"):
                return runner_protocol.runner_route(self.state, req)
            return self._github(req)
        except HttpError as exc:
            return Response(exc.status, exc.body(), exc.headers)

    def _github(self, req: Request) -> Response:
        state = self.state
        route = self._match(req)
        with state.lock:
            try:
                if route is None:
                    raise HttpError(404, "Not Found")
                kind, handler = route
                if kind == "jwt":
                    auth.check_jwt(state, req)
                    auth.check_rate(state, req)
                elif kind == "token":
                    auth.check_token(state, req)
                    auth.check_rate(state, req)
                else:
                    auth.optional_auth(state, req)
                response = _conditional(req, handler(state, req))
            except HttpError as exc:
                response = Response(exc.status, exc.body(), dict(exc.headers))
            finally:
                state.calls.append((req.method, req.path, req.installation_id))
            # GitHub does not count /rate_limit, nor a 304 to an authorised conditional request.
            if req.path != "/rate_limit" and response.status != 304:
                auth.quota(state, req.principal).used += 1
            state.answers.append((req.method, req.path, req.installation_id, response.status))
            auth.add_rate_headers(state, response, req.principal)
            response.headers.setdefault("X-GitHub-Media-Type", "github.v3; format=json")
            response.headers.setdefault("X-GitHub-Api-Version-Selected", "2022-11-28")
            response.headers.setdefault("X-GitHub-Request-Id", uuid.uuid4().hex[:20].upper())
            return response

    def _match(self, req: Request) -> tuple[str, Handler] | None:
        for method, pattern, kind, handler in self._routes:
            match = pattern.fullmatch(req.path)
            if match and method == req.method:
                req.params = match.groupdict()
                return kind, handler
        return None

    # ---- the control surface (control.py) ----------------------------------------------

    def add_installation(
        self,
        account: str,
        account_type: str = "Organization",
        repositories: list[str] | tuple[str, ...] = (),
    ) -> int:
        """Install the App on an account with these repositories; returns the installation id."""
        return control.add_installation(self.state, account, account_type, repositories)

    def add_repository(self, installation_id: int, repo: str) -> int:
        """Add a repository (`owner/name`, owned by the installation's account); its id."""
        return control.add_repository(self.state, installation_id, repo)

    def uninstall(self, installation_id: int) -> str:
        """The App is uninstalled from the account: its tokens are refused (401) and none
        is minted (404), its repositories go, nothing more is sent for it, and GitHub sends
        `installation.deleted`; the delivery's id. Runners registered there stay (GitHub
        does not remove them), out of the App's reach."""
        return control.uninstall(self.state, installation_id)

    def remove_repositories(self, installation_id: int, repos: list[str]) -> str:
        """Repositories taken out of the installation's reach: their API answers 404 to it,
        and GitHub sends `installation_repositories.removed`; the delivery's id."""
        return control.remove_repositories(self.state, installation_id, repos)

    def hold_runners_offline(self, hold: bool = True, names: list[str] | None = None) -> None:
        """Runners that cannot reach GitHub: a session asked for by one (every runner when
        `names` is None) is answered 503, so its registration stays offline while its
        program keeps trying. `hold=False` lets them (or, with no names, every one) in."""
        control.hold_runners_offline(self.state, hold, names)

    def queue_job(
        self,
        repo: str,
        labels: list[str] | tuple[str, ...],
        duration: float = 0.0,
        conclusion: str = "success",
        *,
        name: str = "build",
        workflow: str = "CI",
        run_id: int | None = None,
    ) -> int:
        """Start a workflow run with one queued job, send `queued`; returns the job id.

        With `run_id`, the job joins that run of the same repository instead (a matrix or a
        later job of one workflow run).
        """
        return control.queue_job(
            self.state,
            repo,
            labels,
            duration,
            conclusion,
            name=name,
            workflow=workflow,
            run_id=run_id,
        )

    def cancel_job(self, job_id: int) -> dict[str, Any]:
        """Cancel a queued job (it completes as cancelled, with no runner); returns the job."""
        return control.cancel_job(self.state, job_id)

    def job(self, job_id: int) -> dict[str, Any]:
        """The job in GitHub's `job` shape."""
        return control.job_shape(self.state, job_id)

    def runners(self, installation_id: int) -> list[dict[str, Any]]:
        """The installation's registered runners in GitHub's `runner` shape, by id."""
        return control.runner_shapes(self.state, installation_id)

    def rate_limit(
        self, installation_id: int, reset_in: float | None = 60.0, retry_after: int | None = None
    ) -> None:
        """Rate-limit every call made with the installation's tokens from now on.

        403 with x-ratelimit-remaining 0 and the reset (primary) until `reset_in` seconds of
        `clock` have passed; with `retry_after`, 429 with retry-after instead (secondary).
        Both None: 403 that says nothing usable about when, until `clear_rate_limit`.
        """
        control.rate_limit(self.state, installation_id, reset_in, retry_after)

    def clear_rate_limit(self, installation_id: int) -> None:
        control.clear_rate_limit(self.state, installation_id)

    def rate_limit_app(self, reset_in: float | None = 60.0, retry_after: int | None = None) -> None:
        """Rate-limit every call made with the App's JWT from now on, as `rate_limit` does an
        installation's: GitHub counts the App's own calls apart from its installations'."""
        control.rate_limit_app(self.state, reset_in, retry_after)

    def clear_rate_limit_app(self) -> None:
        control.clear_rate_limit_app(self.state)

    def set_delivery(
        self,
        drop: bool | float = False,
        duplicate: bool | float = False,
        reorder: bool | float = False,
        delay: float = 0.0,
        *,
        early_progress: bool = False,
        queued_lag: float = 0.0,
        new_ids: bool = False,
        concurrency: int = 1,
        seed: int | None = None,
    ) -> None:
        """How deliveries made from now on behave.

        drop, duplicate and reorder are each a switch (True: every delivery, or every job)
        or a share from 0 to 1 (True is 1.0): at a share each delivery is dropped, and each
        one sent is duplicated, with that probability, and that share of jobs is reordered
        (drawn once per job, at its first delivery made under the share; the rest go in
        order). The draws come from a generator seeded with `seed` by this call (None: an
        unpredictable seed), so one seed and one sequence of jobs give the same faults.

        drop: record each as attempted with status_code None and send nothing (GitHub's
        delivery log lists it as "timed out", status_code 0: it never arrived). duplicate:
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
        concurrency: how many deliveries are in flight at once (GitHub does not wait for
        one answer before it sends the next); at 1, the default, they go one after another
        in the order they were made, above 1 that order is not kept between those in flight.
        """
        control.set_delivery(
            self.state,
            drop,
            duplicate,
            reorder,
            delay,
            early_progress=early_progress,
            queued_lag=queued_lag,
            new_ids=new_ids,
            concurrency=concurrency,
            seed=seed,
        )

    @property
    def delivery_mode(self) -> dict[str, Any]:
        """The delivery modes as set_delivery() last set them."""
        return control.delivery_mode(self.state)

    @property
    def delivery_faults(self) -> dict[str, int]:
        """The faults the delivery modes made so far: deliveries dropped (first attempts),
        redeliveries dropped, deliveries duplicated (each one sent twice counts once), and
        jobs whose deliveries were held and sent newest first."""
        return control.delivery_faults(self.state)

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        """Every delivery attempted: id, event, action, job_id, status_code (None if dropped),
        error, hook_delivery_id (its id in GET /app/hook/deliveries) and redelivery."""
        return control.delivery_records(self.state)

    @property
    def hook_deliveries(self) -> list[dict[str, Any]]:
        """GitHub's delivery log of the App's webhook, oldest first, each attempt in the
        shape `GET /app/hook/deliveries` lists it (`delivered_at` an ISO timestamp)."""
        return control.hook_delivery_items(self.state)

    @property
    def calls(self) -> list[tuple[str, str, int | None]]:
        """GitHub API calls made: (method, path, installation id of the token or None)."""
        return control.api_calls(self.state)

    @property
    def answers(self) -> list[tuple[str, str, int | None, int]]:
        """GitHub API calls made and their status: (method, path, installation id, status)."""
        return control.api_answers(self.state)

    def quota_used(self, installation_id: int) -> int:
        """Calls counted against the installation's hourly limit in the current window."""
        return control.quota_used(self.state, installation_id)

    def spend_quota(self, installation_id: int, calls: int) -> None:
        """Count `calls` more against the installation's hour, as if someone else made them."""
        control.spend_quota(self.state, installation_id, calls)

    def spend_app_quota(self, calls: int) -> None:
        """Count `calls` more against the App's own hour (its JWT calls)."""
        control.spend_app_quota(self.state, calls)

    def expire_tokens(self) -> None:
        """Every installation token issued so far stops working (401 Bad credentials)."""
        control.expire_tokens(self.state)

    def wait_sending(self, in_flight: int, waiting: int, timeout: float = 5.0) -> None:
        """Block until exactly `in_flight` deliveries are being sent and `waiting` more wait
        in the outbox: a test asserts what the sender holds back without sleeping."""
        control.wait_sending(self.state, in_flight, waiting, timeout)

    def wait_deliveries(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least `count` deliveries were attempted; returns them."""
        return control.wait_deliveries(self.state, count, timeout)

    def wait_job(self, job_id: int, status: str, timeout: float = 5.0) -> dict[str, Any]:
        """Block until the job reaches `status`; returns it."""
        return control.wait_job(self.state, job_id, status, timeout)

    def send_event(self, event: str, payload: dict[str, Any]) -> str:
        """Send any signed delivery (`installation.deleted`, or a `workflow_job` naming an
        installation the receiver does not know) through the outbox; its delivery id.

        It is recorded like every other attempt, so it can be listed and redelivered; the
        drop mode and the delay apply to it, the per-job modes do not.
        """
        return deliveries.send_event(self.state, event, payload)

    def info(self) -> dict[str, Any]:
        """The fake's identity and installations, for people and the management command."""
        return control.info(self.state)


def _conditional(req: Request, response: Response) -> Response:
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
        return Response(304, None, {"ETag": etag})
    return response


def _github_routes() -> list[Route]:
    """GitHub's routes: (method, path template, credentials, the section function)."""
    table: list[tuple[str, str, str, Handler]] = [
        ("GET", "/app", "jwt", app_api.get_app),
        ("GET", "/app/installations", "jwt", app_api.list_installations),
        ("GET", "/app/installations/{installation_id}", "jwt", app_api.get_installation),
        (
            "POST",
            "/app/installations/{installation_id}/access_tokens",
            "jwt",
            app_api.create_token,
        ),
        ("GET", "/orgs/{org}/installation", "jwt", app_api.get_org_installation),
        ("GET", "/repos/{owner}/{repo}/installation", "jwt", app_api.get_repo_installation),
        ("GET", "/installation/repositories", "token", app_api.list_repositories),
        ("GET", "/rate_limit", "any", app_api.get_rate_limit),
        # The manifest flow (manifests.py): the browser's page, and the code's conversion.
        ("POST", "/settings/apps/new", "any", manifests.new_app_page),
        ("POST", "/organizations/{org}/settings/apps/new", "any", manifests.new_app_page),
        ("POST", "/app-manifests/{code}/conversions", "any", manifests.convert_manifest),
        ("GET", "/orgs/{org}/actions/runner-groups", "token", runners_api.list_runner_groups),
        ("GET", "/app/hook/deliveries", "jwt", hooks_api.list_hook_deliveries),
        ("GET", "/app/hook/deliveries/{delivery_id}", "jwt", hooks_api.get_hook_delivery),
        (
            "POST",
            "/app/hook/deliveries/{delivery_id}/attempts",
            "jwt",
            hooks_api.redeliver_hook_delivery,
        ),
    ]
    for prefix in ("/orgs/{org}", "/repos/{owner}/{repo}"):
        runners = f"{prefix}/actions/runners"
        table += [
            ("POST", f"{runners}/generate-jitconfig", "token", runners_api.generate_jitconfig),
            ("POST", f"{runners}/registration-token", "token", runners_api.registration_token),
            ("POST", f"{runners}/remove-token", "token", runners_api.registration_token),
            ("GET", runners, "token", runners_api.list_runners),
            ("GET", f"{runners}/{{runner_id}}", "token", runners_api.get_runner),
            ("DELETE", f"{runners}/{{runner_id}}", "token", runners_api.delete_runner),
        ]
    table.append(
        # Only the org variant is in the spec subset Zoomies uses.
        (
            "GET",
            "/orgs/{org}/actions/runners/{runner_id}/labels",
            "token",
            runners_api.get_runner_labels,
        )
    )
    runs = "/repos/{owner}/{repo}/actions/runs"
    table += [
        ("GET", runs, "token", runs_api.list_runs),
        ("GET", f"{runs}/{{run_id}}", "token", runs_api.get_run),
        ("GET", f"{runs}/{{run_id}}/jobs", "token", runs_api.list_run_jobs),
        ("GET", "/repos/{owner}/{repo}/actions/jobs/{job_id}", "token", runs_api.get_job),
    ]
    compiled: list[Route] = []
    for method, template, kind, handler in table:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template))
        compiled.append((method, re.compile(regex), kind, handler))
    return compiled
