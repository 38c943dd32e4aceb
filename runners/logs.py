"""`GET /api/v1/runners/{id}/logs`: a runner's output as a server-sent event stream.

The log relay inverted, as the spec draws it (LOG-01..06): the controller never reaches
into a host. The first viewer of a runner opens a stream in this process's hub
(fleet/logs.py) and the runner's host is sent a `stream_logs` task carrying its id; the
agent POSTs the output to `/api/v1/agent/logs/{stream_id}`, which the hub relays here. A
second viewer joins that stream (no second task); the last one leaving sends `cancel_logs`,
or cancels the `stream_logs` task itself if the agent has not taken it yet.

Events: `stream` (first: the stream id and whether it was shared), `output` (`{"text"}`),
`dropped` (`{"bytes"}`: this viewer fell behind and lost that much, LOG-05), `end`
(`{"reason"}`), and a comment every KEEPALIVE seconds so proxies keep an idle stream open.

A finished runner's workload is gone, and with it the output the host could read: the
stream is then the end of its output the controller kept from the runner's end report
(LOG-06), followed by `end`.

A plain async Django view returning StreamingHttpResponse (Channels' AsyncHttpConsumer
delivers nothing once `handle()` returns). It is authorised as the REST
API is, by DRF's authenticators and `accounts.permissions.RoleAccess`: viewer and above,
and a token needs fleet:read. The ORM is touched only in short calls, never across a wait.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils import timezone
from django.views import View
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.settings import api_settings

from accounts import audit
from accounts.actors import actor_for
from accounts.permissions import RoleAccess
from fleet import protocol
from fleet.logs import LogHub, Stream, Viewer, hub, sse_event
from fleet.models import AgentTask
from fleet.states import OPEN_TASK_STATES, TaskKind, TaskState
from fleet.taskqueue import cancel_tasks, enqueue_task
from runners.models import Runner
from runners.states import TERMINAL_STATES

# Seconds between keepalive comments; the stream's task is looked at as often, so a host
# that never takes it (or fails it) ends the stream instead of leaving it silent.
KEEPALIVE = 10.0
FINISHED_REASON = "the runner has finished; this is the end of its output the controller kept"


def _release_connection() -> None:
    # Pool threads see no request end, so close what this call opened (fleet/api.py).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def _db(func: Callable) -> Callable:
    """A short ORM call, its connection closed after. Thread-sensitive, as a DRF view's
    work is: a viewer opens a stream rarely and each call is one or two queries, so the
    shared sync thread is not worth avoiding here (the agents' hot routes do avoid it)."""

    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        finally:
            _release_connection()

    return sync_to_async(call, thread_sensitive=True)


@dataclass(frozen=True)
class RunnerInfo:
    runner_id: int
    host_id: int | None
    finished: bool
    output_tail: str


def _authorize(request: HttpRequest, view: View) -> tuple[HttpResponse | None, str]:
    """(a 401/403 answer or None, the caller as the audit log names them), as DRF would."""
    drf = Request(
        request, authenticators=[cls() for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES]
    )
    try:
        user = drf.user
    except exceptions.AuthenticationFailed as exc:
        return _unauthenticated(str(exc.detail)), ""
    if not (user and user.is_authenticated and user.is_active):
        return _unauthenticated("authentication credentials were not provided"), ""
    permission = RoleAccess()
    if not permission.has_permission(drf, view):
        return JsonResponse({"detail": permission.message}, status=403), ""
    return None, actor_for(drf)


def _unauthenticated(detail: str) -> JsonResponse:
    response = JsonResponse({"detail": detail}, status=401)
    response["WWW-Authenticate"] = "Bearer"
    return response


def _runner(pk: int) -> RunnerInfo | None:
    runner = Runner.objects.filter(pk=pk).only("pk", "host_id", "state", "output_tail").first()
    if runner is None:
        return None
    return RunnerInfo(
        runner_id=runner.pk,
        host_id=runner.host_id,
        finished=runner.state in TERMINAL_STATES,
        output_tail=runner.output_tail,
    )


def open_stream(stream: Stream, *, actor: str) -> int:
    """LOG-01: the host's `stream_logs` task for a stream the hub just opened."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        payload = protocol.StreamLogsPayload(runner_id=stream.runner_id, stream_id=stream.stream_id)
        task = enqueue_task(
            host_id=stream.host_id,
            runner_id=stream.runner_id,
            kind=TaskKind.STREAM_LOGS,
            payload=payload.to_json(),
            now=now,
        )
        audit.record(
            actor=actor,
            action="runner.logs.stream",
            target=Runner(pk=stream.runner_id),
            detail={"stream_id": stream.stream_id, "host_id": stream.host_id},
            at=now,
        )
    return task.pk


def close_stream(stream: Stream, *, actor: str) -> str:
    """LOG-04: the last viewer left. A `stream_logs` the agent has not taken is cancelled
    where it waits; one it has taken is followed by `cancel_logs`. Says which it did."""
    now = timezone.now()
    reason = "the last viewer of the runner's log left"
    with transaction.atomic(durable=True):
        if stream.task_id is not None and cancel_tasks(
            AgentTask.objects.filter(pk=stream.task_id, state=TaskState.PENDING),
            now=now,
            actor=actor,
            reason=reason,
        ):
            return "cancelled"
        payload = protocol.CancelLogsPayload(runner_id=stream.runner_id, stream_id=stream.stream_id)
        enqueue_task(
            host_id=stream.host_id,
            runner_id=stream.runner_id,
            kind=TaskKind.CANCEL_LOGS,
            payload=payload.to_json(),
            now=now,
        )
    return "cancel_logs"


def _task_ended(task_id: int | None) -> str | None:
    """Why the stream's task ended without a stream, or None while it may still deliver."""
    if task_id is None:
        return None
    task = AgentTask.objects.filter(pk=task_id).only("state", "error").first()
    if task is None:
        return "the host's log task is gone"
    if task.state in OPEN_TASK_STATES or task.state == TaskState.DONE:
        return None
    return f"the host could not stream the log ({task.state}): {task.error or 'no reason given'}"


class RunnerLogs(View):
    """GET /api/v1/runners/<id>/logs: the runner's output, live, as server-sent events."""

    # RoleAccess's defaults hold: a read, for viewers and above and fleet:read tokens.
    hub: LogHub = hub  # a class attribute, so a test can give the view a hub of its own

    async def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        refused, actor = await _db(_authorize)(request, self)
        if refused is not None:
            return refused
        info = await _db(_runner)(pk)
        if info is None:
            return JsonResponse({"detail": f"runner {pk} not found"}, status=404)
        if info.finished:
            body: AsyncIterator[bytes] = _finished(info)
        elif info.host_id is None:
            body = _ended_at_once("the runner has no host yet, so there is no output to follow")
        else:
            body = await self._follow(info.runner_id, info.host_id, actor)
        response = StreamingHttpResponse(body, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the events
        return response

    async def _follow(self, runner_id: int, host_id: int, actor: str) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        viewer, opened = self.hub.join(runner_id, host_id, lambda: _wake(loop, woken))
        if opened:
            try:
                task_id = await _db(open_stream)(viewer.stream, actor=actor)
            except BaseException:
                self.hub.leave(viewer)
                raise
            self.hub.set_task(viewer.stream, task_id)
        return self._events(viewer, woken, shared=not opened, actor=actor)

    async def _events(
        self, viewer: Viewer, woken: asyncio.Event, *, shared: bool, actor: str
    ) -> AsyncIterator[bytes]:
        stream = viewer.stream
        try:
            yield sse_event("stream", {"stream_id": stream.stream_id, "shared": shared})
            while True:
                woken.clear()
                frames = self.hub.take(viewer)
                for frame in frames:
                    yield frame.sse()
                if viewer.ended is not None and frames and frames[-1].kind == "end":
                    return
                if frames:
                    continue
                try:
                    await asyncio.wait_for(woken.wait(), KEEPALIVE)
                except TimeoutError:
                    why = await _db(_task_ended)(stream.task_id)
                    if why is not None:
                        self.hub.end(stream, why)
                        continue
                    yield b": keepalive\n\n"
        finally:
            last = self.hub.leave(viewer)
            if last is not None:
                # Shielded: a disconnect cancels this generator, and the host must still hear.
                await asyncio.shield(_db(close_stream)(last, actor=actor))


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    with contextlib.suppress(RuntimeError):  # the viewer's loop has closed: nobody waits
        loop.call_soon_threadsafe(event.set)


async def _finished(info: RunnerInfo) -> AsyncIterator[bytes]:
    """LOG-06: the kept end of a finished runner's output, then the end."""
    yield sse_event("stream", {"stream_id": None, "shared": False})
    if info.output_tail:
        yield sse_event("output", {"text": info.output_tail})
    yield sse_event("end", {"reason": FINISHED_REASON})


async def _ended_at_once(reason: str) -> AsyncIterator[bytes]:
    yield sse_event("stream", {"stream_id": None, "shared": False})
    yield sse_event("end", {"reason": reason})
