"""The agent's side of docs/agent-protocol.md: every call is a request the agent opens (ARCH-07)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from fleet.agent import AGENT_VERSION

API = "/api/v1/agent"
DEFAULT_TIMEOUT = 10.0
# The protocol caps a long-poll at 30 s; the read timeout is the wait plus this margin.
LONG_POLL_MARGIN = 10.0
MAX_WAIT = 30


class ControllerError(Exception):
    """The controller answered with an error, or with something the protocol does not allow."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ControllerUnavailable(ControllerError):
    """No usable answer: connection refused, DNS, TLS, a timeout or a 5xx. Worth retrying."""


class Unauthorized(ControllerError):
    """401: the join token or the agent token is not (or no longer) valid. Not worth retrying."""


@dataclass(frozen=True)
class JoinAnswer:
    """What a successful join hands the agent."""

    host_id: int
    agent_token: str
    heartbeat_interval: float


@dataclass(frozen=True)
class HeartbeatAnswer:
    """The interval to sleep before the next heartbeat (HOST-01), and the host's cordon."""

    heartbeat_interval: float
    cordoned: bool


@dataclass(frozen=True)
class Task:
    """One task as delivered by the long-poll."""

    id: int
    kind: str
    attempt: int | None
    runner_id: int | None
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Task:
        runner_id = raw.get("runner_id")
        payload = raw.get("payload") or {}
        if runner_id is None:
            runner_id = payload.get("runner_id")
        attempt = raw.get("attempt")
        return cls(
            id=int(raw["id"]),
            kind=str(raw["kind"]),
            attempt=int(attempt) if attempt is not None else None,
            runner_id=int(runner_id) if runner_id is not None else None,
            payload=dict(payload),
        )


@dataclass(frozen=True)
class ReportAnswer:
    """Which runners' reports the controller accepted, and which it refused (RUN-18)."""

    accepted: frozenset[int]
    refused: frozenset[int]


class ControllerClient:
    """A thin, typed wrapper over httpx for the five protocol calls.

    httpx.Client is safe to share between the agent's threads; each call has its own timeout.
    """

    def __init__(
        self,
        base_url: str,
        *,
        agent_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.agent_token = agent_token
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            transport=transport,
            headers={"User-Agent": f"zoomies-agent/{AGENT_VERSION}"},
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    # -- the protocol ---------------------------------------------------------------------

    def join(self, join_token: str, info: dict[str, Any]) -> JoinAnswer:
        body = {**info, "join_token": join_token}
        data = self._call("POST", "/join", json=body, auth=False)
        try:
            return JoinAnswer(
                host_id=int(data["host_id"]),
                agent_token=str(data["agent_token"]),
                heartbeat_interval=float(data.get("heartbeat_interval") or 30),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ControllerError(f"the join answer is malformed: {exc!r}") from exc

    def heartbeat(self, body: dict[str, Any]) -> HeartbeatAnswer:
        data = self._call("POST", "/heartbeat", json=body)
        try:
            interval = float(data["heartbeat_interval"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ControllerError(f"the heartbeat answer has no interval: {exc!r}") from exc
        return HeartbeatAnswer(heartbeat_interval=interval, cordoned=bool(data.get("cordoned")))

    def poll_tasks(self, wait: float) -> list[Task]:
        wait = max(0, min(int(wait), MAX_WAIT))
        data = self._call(
            "GET",
            "/tasks",
            params={"wait": wait},
            timeout=httpx.Timeout(self.timeout, read=wait + LONG_POLL_MARGIN),
        )
        try:
            return [Task.from_json(raw) for raw in data["tasks"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ControllerError(f"the task list is malformed: {exc!r}") from exc

    def post_result(
        self, task_id: int, *, ok: bool, error: str | None, attempt: int | None
    ) -> bool:
        """True when the controller accepted the result; False for 404 (not this host's task,
        TASK-14) or 409 (no longer in flight): both are final, so neither is retried."""
        body = {"ok": ok, "error": error, "attempt": attempt}
        try:
            data = self._call("POST", f"/tasks/{task_id}/result", json=body)
        except ControllerError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return bool(data.get("accepted", True))

    def post_reports(self, reports: list[dict[str, Any]]) -> ReportAnswer:
        data = self._call("POST", "/reports", json={"reports": reports})
        try:
            return ReportAnswer(
                accepted=frozenset(int(i) for i in data.get("accepted") or []),
                refused=frozenset(int(i) for i in data.get("refused") or []),
            )
        except (TypeError, ValueError) as exc:
            raise ControllerError(f"the report answer is malformed: {exc!r}") from exc

    # -- plumbing -------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        timeout: httpx.Timeout | None = None,
        auth: bool = True,
    ) -> dict[str, Any]:
        url = API + path
        headers = {}
        if auth:
            if not self.agent_token:
                raise Unauthorized(f"{method} {url}: the agent has no agent token; join first")
            headers["Authorization"] = f"Bearer {self.agent_token}"
        try:
            response = self._http.request(
                method,
                url,
                json=json,
                params=params,
                headers=headers,
                timeout=timeout if timeout is not None else self.timeout,
            )
        except httpx.TimeoutException as exc:
            raise ControllerUnavailable(
                f"{method} {self.base_url}{url}: no answer in time ({type(exc).__name__})"
            ) from exc
        except httpx.TransportError as exc:
            raise ControllerUnavailable(
                f"{method} {self.base_url}{url}: cannot reach the controller: {exc}"
            ) from exc
        if response.status_code >= 400:
            sentence = _error_sentence(response)
            message = f"{method} {url} answered {response.status_code}: {sentence}"
            if response.status_code == 401:
                raise Unauthorized(message, status=401)
            if response.status_code >= 500:
                raise ControllerUnavailable(message, status=response.status_code)
            raise ControllerError(message, status=response.status_code)
        try:
            data = response.json()
        except ValueError as exc:
            raise ControllerError(f"{method} {url} answered with no JSON body") from exc
        if not isinstance(data, dict):
            raise ControllerError(f"{method} {url} answered with a JSON {type(data).__name__}")
        return data


def _error_sentence(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return str(data)[:200]
