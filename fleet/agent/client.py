"""The agent's side of docs/agent-protocol.md: every call is a request the agent opens (ARCH-07)."""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import certifi
import httpx

from fleet import protocol
from fleet.agent import AGENT_VERSION

API = protocol.API_PREFIX
DEFAULT_TIMEOUT = 10.0
# The protocol caps a long-poll at 30 s; the read timeout is the wait plus this margin.
LONG_POLL_MARGIN = 10.0
MAX_WAIT = protocol.MAX_WAIT_SECONDS
Shape = TypeVar("Shape")


class ControllerError(Exception):
    """The controller answered with an error, or with something the protocol does not allow."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ControllerUnavailable(ControllerError):
    """No usable answer: connection refused, DNS, TLS, a timeout or a 5xx. Worth retrying."""


class Unauthorized(ControllerError):
    """401: the join token or the agent token is not (or no longer) valid. Not worth retrying."""


# The answers are the protocol's own shapes (fleet/protocol/), under the names the agent
# has always used for them.
JoinAnswer = protocol.JoinAnswer
HeartbeatAnswer = protocol.HeartbeatAnswer
Task = protocol.Task
ReportAnswer = protocol.ReportsAnswer


class ControllerClient:
    """A thin, typed wrapper over httpx for the protocol's calls.

    httpx.Client is safe to share between the agent's threads; each call has its own timeout.
    """

    def __init__(
        self,
        base_url: str,
        *,
        agent_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.agent_token = agent_token
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            transport=transport,
            verify=tls_context(ca_file),
            headers={"User-Agent": f"zoomies-agent/{AGENT_VERSION}"},
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    # -- the protocol ---------------------------------------------------------------------

    def join(
        self, join_token: str | None, info: Mapping[str, Any], *, claim_code: str | None = None
    ) -> protocol.JoinAnswer:
        """`info` is the host's name and facts; the credential is a join token or, for a
        machine an autoscaler provisioned, the claim code its scale-up event carried. The
        request is checked against the protocol before it leaves, so a bad fact is the
        agent's error, not a 400."""
        credential = {"join_token": join_token} if join_token else {"claim_code": claim_code}
        body = protocol.JoinRequest.from_json({**info, **credential})
        data = self._call("POST", "/join", json=body.to_json(), auth=False)
        return self._read(protocol.JoinAnswer.from_json, data, "join")

    def heartbeat(self, body: Mapping[str, Any]) -> protocol.HeartbeatAnswer:
        request = protocol.HeartbeatRequest.from_json(body)
        data = self._call("POST", "/heartbeat", json=request.to_json())
        return self._read(protocol.HeartbeatAnswer.from_json, data, "heartbeat")

    def renew_token(self) -> protocol.TokenAnswer:
        """ESC-06: the next short-lived agent token, asked for with the current one. The
        caller switches to it (`agent_token`) once it has kept it."""
        data = self._call("POST", "/token/renew", json={})
        return self._read(protocol.TokenAnswer.from_json, data, "token renewal")

    def poll_tasks(self, wait: float) -> protocol.TaskList:
        wait = max(0, min(int(wait), MAX_WAIT))
        data = self._call(
            "GET",
            "/tasks",
            params={"wait": wait},
            timeout=httpx.Timeout(self.timeout, read=wait + LONG_POLL_MARGIN),
        )
        return self._read(protocol.TaskList.from_json, data, "task list")

    def post_result(
        self,
        task_id: int,
        *,
        ok: bool,
        error: str | None,
        attempt: int | None,
        report: Mapping[str, Any] | None = None,
    ) -> bool:
        """True when the controller accepted the result; False for 404 (not this host's task,
        TASK-14) or 409 (no longer in flight): both are final, so neither is retried."""
        if error is not None and len(error) > protocol.MAX_MESSAGE:
            error = error[: protocol.MAX_MESSAGE - 1] + "…"
        body = protocol.TaskResult(ok=ok, error=error, attempt=attempt, report=report)
        try:
            data = self._call("POST", f"/tasks/{task_id}/result", json=body.to_json())
        except ControllerError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return self._read(protocol.TaskResultAnswer.from_json, data, "result").accepted

    def post_results(
        self, results: Sequence[protocol.TaskResultItem]
    ) -> list[protocol.TaskResultOutcome]:
        """Several results in one request (`POST tasks/results`): one outcome per result, in
        order. A controller without the route answers 404 or 405 (ControllerError); an
        answer that does not account for every result is a ControllerError too."""
        body = protocol.TaskResultsRequest(results=tuple(_capped(r) for r in results))
        data = self._call("POST", "/tasks/results", json=body.to_json())
        answer = self._read(protocol.TaskResultsAnswer.from_json, data, "results")
        if [o.id for o in answer.results] != [r.id for r in results]:
            raise ControllerError("the results answer does not match the results sent")
        return list(answer.results)

    def post_reports(
        self, reports: Sequence[protocol.RunnerReport | Mapping[str, Any]]
    ) -> protocol.ReportsAnswer:
        body = protocol.ReportsRequest(
            reports=tuple(
                r if isinstance(r, protocol.RunnerReport) else protocol.RunnerReport.from_json(r)
                for r in reports
            )
        )
        data = self._call("POST", "/reports", json=body.to_json())
        return self._read(protocol.ReportsAnswer.from_json, data, "report")

    def post_inventory(self, runners: Sequence[int], *, complete: bool) -> protocol.InventoryAnswer:
        """A starting agent's inventory: the runner ids with a workload on this host, and
        whether every backend could be listed (issue 11 item 3)."""
        body = protocol.InventoryRequest(runners=tuple(runners), complete=complete)
        data = self._call("POST", "/inventory", json=body.to_json())
        return self._read(protocol.InventoryAnswer.from_json, data, "inventory")

    def post_log_chunk(self, stream_id: str, chunk: protocol.LogChunk) -> bool:
        """LOG-02: one piece of a runner's output; False when nobody watches any more (the
        stream was cancelled or ended: 404), and the agent stops reading."""
        try:
            data = self._call("POST", f"/logs/{stream_id}", json=chunk.to_json())
        except ControllerError as exc:
            if exc.status == 404:
                return False
            raise
        return self._read(protocol.LogChunkAnswer.from_json, data, "log chunk").open

    @staticmethod
    def _read(shape: Callable[[Any], Shape], data: dict[str, Any], what: str) -> Shape:
        try:
            return shape(data)
        except protocol.ProtocolError as exc:
            raise ControllerError(f"the {what} answer is malformed: {exc}") from exc

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
            return protocol.loads(response.content)
        except protocol.ProtocolError as exc:
            raise ControllerError(f"{method} {url} answered with no JSON object: {exc}") from exc


def _capped(item: protocol.TaskResultItem) -> protocol.TaskResultItem:
    """The error cut to the protocol's bound, as `post_result` cuts it."""
    error = item.result.error
    if error is None or len(error) <= protocol.MAX_MESSAGE:
        return item
    cut = error[: protocol.MAX_MESSAGE - 1] + "…"
    return protocol.TaskResultItem(item.id, dataclasses.replace(item.result, error=cut))


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Verify the controller's certificate against `ca_file` (a PEM bundle, for a controller
    whose certificate a private CA signed), or against certifi's CAs (httpx's default)."""
    try:
        return ssl.create_default_context(cafile=ca_file or certifi.where())
    except (OSError, ssl.SSLError) as exc:
        raise ControllerError(f"cannot read the CA bundle {ca_file}: {exc}") from exc


def _error_sentence(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return str(data["error"])
    return str(data)[:200]
