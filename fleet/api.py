"""The controller's side of the agent protocol (docs/agent-protocol.md).

Thin views: parse, authenticate the agent by the sha256 of its bearer token, call one
action, answer JSON. Errors have one shape, `{"error": "<sentence>"}`. The task long-poll
is an async view that touches the ORM only through short `sync_to_async` calls, each of
which gives its connection back before the wait (DESIGN.md pitfalls).

Those calls are not thread-sensitive: under ASGI every thread-sensitive call (each sync
view, the admin, the API) queues on one shared thread, and a fleet of polling agents would
queue there with them. They run on the executor's pool instead; each opens its own
connection on the pool thread it lands on and closes it before returning.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from functools import wraps

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from accounts.sealing import SealError
from fleet import actions, wakeups
from fleet.models import AgentTask, Host
from fleet.selectors import host_for_agent_token
from fleet.taskqueue import take_tasks, wire_payload

log = logging.getLogger("zoomies.fleet")

MAX_BODY_BYTES = 1024 * 1024  # a report batch for a few hundred runners fits many times over
MAX_WAIT_SECONDS = 30.0  # the protocol's cap on `wait`
TASKS_PER_POLL = 10


def error(message: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    for key, value in headers.items():
        response[key] = value
    return response


def unauthorized(message: str = "a valid agent token is required") -> JsonResponse:
    return error(message, 401, **{"WWW-Authenticate": "Bearer"})


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def read_json(request: HttpRequest) -> dict:
    length = request.META.get("CONTENT_LENGTH") or "0"
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is larger than {MAX_BODY_BYTES} bytes", 413)
    body = request.body
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is larger than {MAX_BODY_BYTES} bytes", 413)
    try:
        data = json.loads(body or b"{}")
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def agent_view(*, authenticated: bool = True) -> Callable:
    """A synchronous POST route: JSON errors, the body cap, and the agent's host when asked."""

    def decorate(view: Callable) -> Callable:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> JsonResponse:
            if request.method != "POST":
                return error("use POST", 405, Allow="POST")
            try:
                if authenticated:
                    host = host_for_agent_token(bearer_token(request))
                    if host is None:
                        return unauthorized()
                    kwargs["host"] = host
                data = read_json(request)
                return view(request, data, *args, **kwargs)
            except BadRequest as exc:
                return error(str(exc), exc.status)
            except actions.FleetError as exc:
                if exc.status == 401:
                    return unauthorized(str(exc))
                return error(str(exc), exc.status)

        return wrapper

    return decorate


@agent_view(authenticated=False)
def join(request: HttpRequest, data: dict) -> JsonResponse:
    host, token = actions.join_host(
        join_token=data.get("join_token"),
        name=data.get("name"),
        facts=data,
        now=timezone.now(),
    )
    answer = actions.heartbeat_answer(host)
    return JsonResponse(
        {
            "host_id": host.pk,
            "agent_token": token,
            "heartbeat_interval": answer["heartbeat_interval"],
        }
    )


@agent_view()
def heartbeat(request: HttpRequest, data: dict, *, host: Host) -> JsonResponse:
    return JsonResponse(actions.record_heartbeat(host=host, facts=data, now=timezone.now()))


@agent_view()
def task_result(request: HttpRequest, data: dict, task_id: int, *, host: Host) -> JsonResponse:
    ok = data.get("ok")
    if not isinstance(ok, bool):
        raise BadRequest("ok must be true or false")
    err = data.get("error")
    if err is not None and not isinstance(err, str):
        raise BadRequest("error must be a string or null")
    attempt = data.get("attempt")
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
        raise BadRequest("attempt must be an integer or null")
    actions.record_task_result(
        host=host, task_id=task_id, ok=ok, error=err, attempt=attempt, now=timezone.now()
    )
    return JsonResponse({"accepted": True})


@agent_view()
def reports(request: HttpRequest, data: dict, *, host: Host) -> JsonResponse:
    accepted, refused = actions.apply_reports(
        host=host, reports=data.get("reports"), now=timezone.now()
    )
    return JsonResponse({"accepted": accepted, "refused": refused})


# -- the long-poll ------------------------------------------------------------------------


def task_wire(task: AgentTask) -> dict:
    """A task as its own agent receives it: the only place a sealed env is opened."""
    return {
        "id": task.pk,
        "kind": task.kind,
        "attempt": task.attempt,
        "runner_id": task.runner_id,
        "payload": wire_payload(task),
    }


def _release_connection() -> None:
    # CONN_MAX_AGE is 0, but only a request's end would close it, and a pool thread never
    # sees one: close every connection this thread opened, so none is held while the poll
    # waits or left behind on the pool thread. Never inside an atomic block (a test's).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


# The long-poll's database calls: short, self-contained, and off the thread-sensitive
# executor (see the module docstring).
def _off_the_shared_thread(func: Callable) -> Callable:
    return sync_to_async(func, thread_sensitive=False)


def _authenticate(token: str | None) -> tuple[int | None, float]:
    """The host of this token, and the default wait (the registry may read the database)."""
    from zoomies_site import registry

    try:
        host = host_for_agent_token(token)
        default_wait = registry.get("agent.long_poll_wait").total_seconds()
        return (host.pk if host else None), default_wait
    finally:
        _release_connection()


def _take(host_id: int) -> list[dict]:
    try:
        now = timezone.now()
        wires = []
        for task in take_tasks(host_id, now, TASKS_PER_POLL):
            try:
                wires.append(task_wire(task))
            except SealError as exc:
                # Sealed under another key (a lost or rotated one): the agent could do
                # nothing with it, so it ends here, failing a create's runner (RUN-14).
                log.error("task %s cannot be delivered: %s", task.pk, exc)
                actions.record_task_result(
                    host=task.host,
                    task_id=task.pk,
                    ok=False,
                    error=f"the controller cannot unseal the task's env: {exc}",
                    attempt=task.attempt,
                    now=now,
                    actor="system:taskqueue",
                )
        return wires
    finally:
        _release_connection()


def parse_wait(raw: str | None, default: float) -> float:
    if raw is None or raw == "":
        return min(default, MAX_WAIT_SECONDS)
    try:
        wait = float(raw)
    except ValueError:
        raise BadRequest("wait must be a number of seconds") from None
    if not math.isfinite(wait) or wait < 0:
        raise BadRequest("wait must be a number of seconds")
    return min(wait, MAX_WAIT_SECONDS)


async def tasks(request: HttpRequest) -> JsonResponse:
    """`GET tasks?wait=N`: the host's tasks at once, or after a wake, or `[]` after N s."""
    if request.method != "GET":
        return error("use GET", 405, Allow="GET")
    host_id, default_wait = await _off_the_shared_thread(_authenticate)(bearer_token(request))
    if host_id is None:
        return unauthorized()
    try:
        wait = parse_wait(request.GET.get("wait"), default_wait)
    except BadRequest as exc:
        return error(str(exc), exc.status)
    deadline = time.monotonic() + wait
    while True:
        taken = await _off_the_shared_thread(_take)(host_id)
        remaining = deadline - time.monotonic()
        if taken or remaining <= 0:
            return JsonResponse({"tasks": taken})
        # A wake is only a hint (another poll may take the task first, or a create may turn
        # out to be cancelled), so the loop takes again and waits out the rest if need be.
        await wakeups.wait_for_work(host_id, remaining)
