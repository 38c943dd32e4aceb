"""The controller's side of the agent protocol (docs/agent-protocol.md).

Thin views: parse, authenticate the agent by the sha256 of its bearer token, call one
action, answer JSON. Errors have one shape, `{"error": "<sentence>"}`. The task long-poll
is an async view that touches the ORM only through short `sync_to_async` calls, so a
waiting poll holds no thread and no connection of its own.

Those calls are not thread-sensitive: under ASGI every thread-sensitive call (each sync
view, the admin, the API) queues on one shared thread, and a fleet of polling agents would
queue there with them. They run on POLL_THREADS long-lived threads of their own instead,
which keep their database connection from one call to the next and close it on any error,
as fleet/agent_asgi.py's threads do: a connection opened and closed for each call was what
a profile of the web server at 1,000 agents showed first (docs/performance.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import wraps

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError, connections
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from fleet import actions, logs, protocol, task_results, wakeups
from fleet.models import AgentTask, Host
from fleet.runner_side import runner_side
from fleet.selectors import host_cordoned, host_for_agent_token
from fleet.taskqueue import take_tasks, wire_payload
from zoomies_site.core import registry
from zoomies_site.core.sealing import SealError

log = logging.getLogger("zoomies.fleet")

MAX_BODY_BYTES = protocol.MAX_BODY_BYTES
# The tasks one poll hands out. They are already this host's (the scheduler placed them), so
# a larger take is no less fair; in a burst each take waits for SQLite's write lock, and 50
# a take handed out 500 creates in 4.3 to 5.7 s where 10 took 6.7 to 7.5 (docs/performance.md,
# round 9).
TASKS_PER_POLL = 50
# Each call is a query or two, so two threads keep up with thousands of polls; they also
# bound how many connections the long-poll holds at once, however many agents wait.
POLL_THREADS = 2
POLL_THREAD_PREFIX = "agent-poll"
_poll_pool = ThreadPoolExecutor(max_workers=POLL_THREADS, thread_name_prefix=POLL_THREAD_PREFIX)
# What an agent is told to wait before trying again when the database is busy (a 503).
BUSY_RETRY_AFTER_SECONDS = 5


def error(message: str, status: int, *, field: str | None = None, **headers: str) -> JsonResponse:
    response = JsonResponse(protocol.ErrorAnswer(message, field).to_json(), status=status)
    for key, value in headers.items():
        response[key] = value
    return response


def unauthorized(message: str = "a valid agent token is required") -> JsonResponse:
    return error(message, 401, **{"WWW-Authenticate": "Bearer"})


# What a busy database or refusing storage says (SQLite's words; PostgreSQL's for a full
# disk): an outage the agent should ride out with retries, where a missing table is a fault.
UNAVAILABLE_MESSAGES = (
    "database is locked",
    "database is busy",
    "readonly database",  # the file or its directory made read-only under the controller
    "disk i/o error",  # SQLite's word for a write the file system refused, the -shm's too
    "database or disk is full",
    "no space left on device",
)


def database_unavailable(exc: Exception) -> bool:
    """True for a database that is busy or gone for now (worth the agent's retry): SQLite's
    write lock held past its busy timeout, storage that refuses writes, or a connection the
    server dropped."""
    if isinstance(exc, InterfaceError):
        return True
    message = str(exc).lower()
    if any(words in message for words in UNAVAILABLE_MESSAGES):
        return True
    return any(not conn.is_usable() for conn in connections.all(initialized_only=True)
               if conn.connection is not None)  # fmt: skip


def busy(request: HttpRequest, exc: Exception) -> JsonResponse:
    """The 503 for a busy or dropped database, logged once: the agent tries again."""
    log.warning("agent %s: the database is unavailable: %s", request.path, exc)
    return error(
        "the database is busy or refusing writes; nothing was recorded, try again",
        503,
        **{"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)},
    )


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
    """The body as a JSON object, through the protocol's loader (no NaN, no 10,000-deep
    nesting, no RecursionError); ProtocolError for anything else."""
    too_large = f"the body is larger than {MAX_BODY_BYTES} bytes"
    length = request.META.get("CONTENT_LENGTH") or "0"
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise BadRequest(too_large, 413)
    try:
        body = request.body
    except RequestDataTooBig:
        raise BadRequest(too_large, 413) from None
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(too_large, 413)
    return protocol.loads(body)


def agent_view(*, authenticated: bool = True) -> Callable:
    """A synchronous POST route: JSON errors, the body cap, and the agent's host when asked.

    The view reads the body into its protocol shape (fleet/protocol/); a body that is not
    that shape is a 400 naming the field (`{"error": ..., "field": "reports[2].runner_id"}`).
    """

    def decorate(view: Callable) -> Callable:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> JsonResponse:
            if request.method != "POST":
                return error("use POST", 405, Allow="POST")
            try:
                if authenticated:
                    host = host_for_agent_token(bearer_token(request), now=timezone.now())
                    if host is None:
                        return unauthorized()
                    kwargs["host"] = host
                data = read_json(request)
                return view(request, data, *args, **kwargs)
            except protocol.ProtocolError as exc:
                return error(f"{exc.path}: {exc.reason}", 400, field=exc.path)
            except BadRequest as exc:
                return error(str(exc), exc.status)
            except actions.FleetError as exc:
                if exc.status == 401:
                    return unauthorized(str(exc))
                return error(str(exc), exc.status)
            except (OperationalError, InterfaceError) as exc:
                if not database_unavailable(exc):
                    raise  # a missing table or the like is a fault, not a reason to retry
                _release_connection()  # a pool thread's kept connection starts afresh
                return busy(request, exc)

        return wrapper

    return decorate


@agent_view(authenticated=False)
def join(request: HttpRequest, data: dict) -> JsonResponse:
    body = protocol.JoinRequest.from_json(data)
    host, token = actions.join_host(
        join_token=body.join_token,
        name=body.name,
        facts=body,
        now=timezone.now(),
        claim_code=body.claim_code,
    )
    answer = protocol.JoinAnswer(
        host_id=host.pk,
        agent_token=token,
        tunables=actions.agent_tunables(),
        agent_token_expires_in=_seconds_until(host.agent_token_expires_at, host.joined_at),
    )
    return JsonResponse(answer.to_json())


def _seconds_until(expires: datetime | None, now: datetime | None) -> float | None:
    if expires is None or now is None:
        return None
    return (expires - now).total_seconds()


@agent_view()
def renew_token(request: HttpRequest, data: dict, *, host: Host) -> JsonResponse:
    """ESC-06: the next short-lived agent token, for the one this request carries."""
    now = timezone.now()
    token, expires = actions.renew_agent_token(
        host=host, presented=bearer_token(request) or "", now=now
    )
    answer = protocol.TokenAnswer(
        agent_token=token, agent_token_expires_in=(expires - now).total_seconds()
    )
    return JsonResponse(answer.to_json())


@agent_view()
def heartbeat(request: HttpRequest, data: dict, *, host: Host) -> JsonResponse:
    body = protocol.HeartbeatRequest.from_json(data)
    return JsonResponse(actions.record_heartbeat(host=host, facts=body, now=timezone.now()))


@agent_view()
def task_result(request: HttpRequest, data: dict, task_id: int, *, host: Host) -> JsonResponse:
    body = protocol.TaskResult.from_json(data)
    task_results.record_task_result(
        host=host,
        task_id=task_id,
        ok=body.ok,
        error=body.error,
        attempt=body.attempt,
        now=timezone.now(),
        report=body.report,
    )
    return JsonResponse(protocol.TaskResultAnswer(accepted=True).to_json())


@agent_view()
def results(request: HttpRequest, data: dict, *, host: Host) -> JsonResponse:
    """`POST tasks/results`: several results in one request and one transaction (issue 28),
    each answered as the single route would have answered it."""
    body = protocol.TaskResultsRequest.from_json(data)
    outcomes = task_results.record_task_results(host=host, results=body.results, now=timezone.now())
    return JsonResponse(protocol.TaskResultsAnswer(results=tuple(outcomes)).to_json())


@agent_view()
def reports(request: HttpRequest, data: dict, *, host: Host) -> JsonResponse:
    body = protocol.ReportsRequest.from_json(data)
    accepted, refused = runner_side().apply_reports(
        host=host, reports=body.reports, now=timezone.now()
    )
    return JsonResponse(
        protocol.ReportsAnswer(accepted=tuple(accepted), refused=tuple(refused)).to_json()
    )


@agent_view()
def inventory(request: HttpRequest, data: dict, *, host: Host) -> JsonResponse:
    """A starting agent's inventory, before its first poll (issue 11 item 3)."""
    body = protocol.InventoryRequest.from_json(data)
    answer = actions.record_inventory(host=host, inventory=body, now=timezone.now())
    return JsonResponse(answer.to_json())


# -- the long-poll ------------------------------------------------------------------------


def task_wire(task: AgentTask) -> dict:
    """A task as its own agent receives it: the only place a sealed env is opened."""
    return protocol.Task(
        id=task.pk,
        kind=task.kind,
        attempt=task.attempt,
        runner_id=task.runner_id,
        payload=wire_payload(task),
    ).to_json()


def _release_connection() -> None:
    # CONN_MAX_AGE is 0, but only a request's end would close it, and a pool thread never
    # sees one: close every connection this thread opened, after an error (a broken
    # connection is never reused) or at a test's end. Never inside an atomic block (a test's).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


# The long-poll's database calls: short, self-contained, and on the poll's own threads
# (see the module docstring). The pool is looked up at each call, so each test can have a
# pool of its own (tests/conftest.py).
def _on_the_poll_threads(func: Callable) -> Callable:
    return sync_to_async(func, thread_sensitive=False, executor=_poll_pool)


def close_poll_connections(pool: ThreadPoolExecutor, threads: int = POLL_THREADS) -> None:
    """Close the connections every thread of `pool` keeps: one call per thread at once, held
    at a barrier so no thread takes two (a pool short of threads starts them to take these)."""
    barrier = threading.Barrier(threads)

    def close() -> None:
        barrier.wait(timeout=30)
        _release_connection()

    for done in [pool.submit(close) for _ in range(threads)]:
        done.result(timeout=60)


class DatabaseBusy(Exception):
    """A poll thread's call found the database busy or its connection dropped (a restart):
    the view answers 503 and the agent tries again, on a fresh connection."""


def _poll_call(func: Callable) -> Callable:
    """A long-poll database call on a poll thread: whatever breaks, the thread's connection
    is closed so its next call starts afresh; a busy or dropped database (judged here, on
    the thread that holds the connection) becomes DatabaseBusy."""

    @wraps(func)
    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            unavailable = database_unavailable(exc)
            _release_connection()
            if unavailable:
                raise DatabaseBusy(str(exc)) from exc
            raise  # a missing table or the like is a fault, not a reason to retry
        except BaseException:
            _release_connection()
            raise

    return call


@_poll_call
def _authenticate(token: str | None) -> tuple[int | None, float]:
    """The host of this token, and the default wait (the registry may read the database)."""
    host = host_for_agent_token(token, now=timezone.now())
    default_wait = registry.get("agent.long_poll_wait").total_seconds()
    return (host.pk if host else None), default_wait


@_poll_call
def _take(host_id: int, polled_at: datetime) -> tuple[list[dict], bool | None]:
    """The tasks taken, and the host's cordon read after taking them (None with none)."""
    now = timezone.now()
    wires: list[dict] = []
    for task in take_tasks(host_id, now, TASKS_PER_POLL, polled_at=polled_at):
        try:
            wires.append(task_wire(task))
        except SealError as exc:
            # Sealed under another key (a lost or rotated one): the agent could do
            # nothing with it, so it ends here, failing a create's runner (RUN-14).
            log.error("task %s cannot be delivered: %s", task.pk, exc)
            task_results.record_task_result(
                host=task.host,
                task_id=task.pk,
                ok=False,
                error=f"the controller cannot unseal the task's env: {exc}",
                attempt=task.attempt,
                now=now,
                actor="system:taskqueue",
            )
    if not wires:
        return wires, None
    return wires, host_cordoned(host_id)


# Exempt so a POST gets the protocol's JSON 405 rather than the CSRF middleware's HTML 403
# (an agent sends no cookie, so there is nothing for CSRF to protect here).
@csrf_exempt
async def tasks(request: HttpRequest) -> JsonResponse:
    """`GET tasks?wait=N`: the host's tasks at once, or after a wake, or `[]` after N s."""
    if request.method != "GET":
        return error("use GET", 405, Allow="GET")
    try:
        return await _long_poll(request)
    except DatabaseBusy as exc:
        return busy(request, exc)


async def _long_poll(request: HttpRequest) -> JsonResponse:
    host_id, default_wait = await _on_the_poll_threads(_authenticate)(bearer_token(request))
    if host_id is None:
        return unauthorized()
    try:
        wait = protocol.parse_wait(request.GET.get("wait"), default_wait)
    except protocol.ProtocolError as exc:
        return error(f"{exc.path}: {exc.reason}", 400, field=exc.path)
    deadline = time.monotonic() + wait
    polled_at = timezone.now()
    while True:
        taken, cordoned = await _on_the_poll_threads(_take)(host_id, polled_at)
        remaining = deadline - time.monotonic()
        # A wake is only a hint (another poll may take the task first, or a create may turn
        # out to be cancelled), so the loop takes again and waits out the rest if need be.
        # A wait that ran out unwoken answers empty without a second look: the agent polls
        # again at once, and that poll's first take finds whatever came in the last instant
        # (a third of an idle fleet's database calls, docs/performance.md).
        if not taken and remaining > 0 and await wakeups.wait_for_work(host_id, remaining):
            continue
        # Each one a protocol.Task; the cordon rides along (protocol.TaskList).
        return JsonResponse(protocol.TaskList(cordoned=cordoned).to_json() | {"tasks": taken})


# -- runner logs (LOG-02) -----------------------------------------------------------------


@_poll_call
def _host_id(token: str | None) -> int | None:
    host = host_for_agent_token(token, now=timezone.now())
    return host.pk if host else None


@csrf_exempt
async def log_chunk(request: HttpRequest, stream_id: str) -> JsonResponse:
    """`POST logs/{stream_id}`: the next piece of a runner's output, handed to the stream's
    viewers in this process (fleet/logs.py). An async view, so a chunk never queues on the
    shared sync thread; the hub only appends, so it never waits on a viewer either."""
    if request.method != "POST":
        return error("use POST", 405, Allow="POST")
    try:
        host_id = await _on_the_poll_threads(_host_id)(bearer_token(request))
    except DatabaseBusy as exc:
        return busy(request, exc)
    if host_id is None:
        return unauthorized()
    try:
        chunk = protocol.LogChunk.from_json(read_json(request))
    except protocol.ProtocolError as exc:
        return error(f"{exc.path}: {exc.reason}", 400, field=exc.path)
    except BadRequest as exc:
        return error(str(exc), exc.status)
    still_open = logs.hub.deliver(
        stream_id, host_id, chunk.data, eof=chunk.eof, error=chunk.error or ""
    )
    if still_open is None:
        # Cancelled, ended, or never opened here: the agent stops reading.
        return error(f"no log stream {stream_id[:64]} is open for this host", 404)
    return JsonResponse(protocol.LogChunkAnswer(open=still_open).to_json())
