"""The event stream: one relay per web process tails the outbox (EVT-03) and fans each
frame out through the channel layer to the SSE views and the admin's websockets. It looks
when an event is committed (a wake on the wake bus, from whichever process wrote it) and
at least every `poll` seconds.

Frames are rendered here, once per event for every viewer, by the API's own serializers
(EVT-05). A frame for a row that no longer exists (a reaped runner, a deleted pool) says
so with `"object": null`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db.models import Q
from django.utils import timezone

from fleet.rest_api import HostSerializer, host_queryset
from runners.api import JobSerializer, PoolSerializer, RunnerSerializer, runner_queryset
from runners.models import Job, Pool
from zoomies_site.core import wakebus
from zoomies_site.core.faultlog import FaultLog
from zoomies_site.core.models import Event
from zoomies_site.overview import overview
from zoomies_site.problems import problems

log = logging.getLogger("zoomies.events")

# resource -> (queryset of the rows to render, the API's GET serializer)
RENDERERS: dict[str, tuple[Callable, type]] = {
    "runner": (runner_queryset, RunnerSerializer),
    "job": (lambda: Job.objects.all(), JobSerializer),
    "pool": (lambda: Pool.objects.all(), PoolSerializer),
    "host": (host_queryset, HostSerializer),
}
# More events than this behind, a resuming client is told to reload instead.
MAX_BACKLOG = 2000
# An id missing from the tail may belong to a transaction still committing (PostgreSQL
# hands out ids before commit); it is looked for again for this long, then given up.
GAP_WAIT = 10.0
# At most this many ids below the newest are waited for: more transactions than this cannot
# be open at once, and an unbounded range would be a huge set and query after a jump.
MAX_GAPS = 1000
# Overview and problems are recomputed after each batch of events and at least this often
# (problems such as runners.not_progressing arise with time alone).
SUMMARY_EVERY = 5.0
# A relay with no subscriber for this long stops tailing (an idle process queries nothing);
# the next subscriber starts it again from the newest event.
IDLE_STOP = 60.0


def render(events: Iterable[Event]) -> list[dict]:
    """Frames for `events`, oldest first: one per resource row, carrying its newest id."""
    latest: dict[tuple[str, str], Event] = {}
    for event in events:
        key = (event.resource, event.resource_id)
        latest.pop(key, None)  # re-inserted so the order follows the newest event
        latest[key] = event
    by_resource: dict[str, list[str]] = {}
    for resource, rid in latest:
        by_resource.setdefault(resource, []).append(rid)
    shapes: dict[tuple[str, str], dict] = {}
    for resource, ids in by_resource.items():
        if resource not in RENDERERS:
            continue
        queryset, serializer = RENDERERS[resource]
        rows = queryset().filter(pk__in=[int(i) for i in ids if i.isdigit()])
        for row in rows:
            shapes[(resource, str(row.pk))] = serializer(row).data
    frames = []
    for key, event in latest.items():
        if event.resource not in RENDERERS:
            continue
        frames.append(
            {
                "id": event.pk,
                "event": event.resource,
                "data": {
                    "kind": event.kind,
                    "id": int(event.resource_id) if event.resource_id.isdigit() else None,
                    "object": shapes.get(key),
                },
            }
        )
    frames.sort(key=lambda f: f["id"])
    return frames


def backlog(after: int) -> tuple[list[dict], bool]:
    """The frames a client resuming after event `after` missed, and whether it must reload
    instead (its event was pruned, or it is too far behind)."""
    oldest = Event.objects.order_by("pk").values_list("pk", flat=True).first()
    if oldest is not None and after < oldest - 1:
        return [], True
    events = list(Event.objects.filter(pk__gt=after).order_by("pk")[: MAX_BACKLOG + 1])
    if len(events) > MAX_BACKLOG:
        return [], True
    return render(events), False


def summary(now: datetime) -> dict:
    return {"overview": overview(now), "problems": problems(now)}


def sse(frame: dict) -> str:
    """One frame in the SSE wire format."""
    lines = []
    if frame.get("id") is not None:
        lines.append(f"id: {frame['id']}")
    lines.append(f"event: {frame['event']}")
    lines.append("data: " + json.dumps(frame["data"], separators=(",", ":"), default=str))
    return "\n".join(lines) + "\n\n"


class Relay:
    """Tails the outbox for one web process: one query per tick, whatever the viewers.

    `collect(now)` is the sync unit of work (tests call it directly with a chosen clock);
    `run()` loops it and hands each frame to the channel layer group `group`.
    """

    def __init__(self, *, poll: float = 0.5, clock: Callable[[], float] = time.monotonic):
        # Per process: with Redis as the channel layer a shared name would deliver each
        # frame once per web process.
        self.group = f"zoomies-events-{uuid.uuid4().hex[:12]}"
        self.poll = poll
        self.clock = clock
        self.faults = FaultLog(log, "event relay: a tick")
        self.cursor: int | None = None
        self.gaps: dict[int, float] = {}
        self.summary: dict | None = None
        self.summary_at = float("-inf")
        self.task: asyncio.Task | None = None
        self.subscribers = 0
        self.idle_since = clock()
        self.bus: wakebus.Listener | bool | None = None  # False: could not be set up

    def subscribe(self) -> None:
        """Counts a viewer in. Called before the viewer's first await, so the loop cannot
        stop between this and the viewer's prime."""
        self.subscribers += 1
        self.ensure_running()

    def unsubscribe(self) -> None:
        self.subscribers -= 1
        if self.subscribers == 0:
            self.idle_since = self.clock()

    def idle(self) -> bool:
        return self.subscribers == 0 and self.clock() - self.idle_since >= IDLE_STOP

    def prime(self) -> None:
        """Starts the tail at the newest event. A subscriber calls it before reading its
        backlog, so nothing committed between the two is skipped."""
        if self.cursor is None:
            self.cursor = Event.objects.order_by("-pk").values_list("pk", flat=True).first() or 0

    def collect(self, now: datetime) -> list[dict]:
        """Frames for the events committed since the last call, then overview and problems
        when either differs from the last ones sent (EVT-06)."""
        self.prime()
        tick = self.clock()
        self.gaps = {pk: seen for pk, seen in self.gaps.items() if tick - seen < GAP_WAIT}
        query = (
            Q(pk__gt=self.cursor) | Q(pk__in=list(self.gaps))
            if self.gaps
            else Q(pk__gt=self.cursor)
        )
        events = list(Event.objects.filter(query).order_by("pk")[:MAX_BACKLOG])
        fresh = [e.pk for e in events if e.pk > self.cursor]
        if fresh:
            # Primed on an empty outbox, the ids below the first one seen are not known to
            # exist (PostgreSQL's sequence does not restart when rows are pruned or rolled
            # back), so the tail starts there rather than waiting on every lower number.
            start = self.cursor + 1 if self.cursor else min(fresh)
            start = max(start, max(fresh) - MAX_GAPS)
            expected = set(range(start, max(fresh) + 1))
            for missing in expected - set(fresh):
                self.gaps.setdefault(missing, tick)
            self.cursor = max(fresh)
        for e in events:
            self.gaps.pop(e.pk, None)
        frames = render(events)
        if events or tick - self.summary_at >= SUMMARY_EVERY:
            frames += self.summary_frames(now, tick)
        return frames

    def summary_frames(self, now: datetime, tick: float) -> list[dict]:
        current = summary(now)
        self.summary_at = tick
        previous = self.summary or {}
        self.summary = current
        return [
            {"id": None, "event": name, "data": current[name]}
            for name in ("overview", "problems")
            if current[name] != previous.get(name)
        ]

    def current_summary(self, now: datetime) -> list[dict]:
        """What a new subscriber is sent first: the last overview and problems sent."""
        if self.summary is None:
            self.summary = summary(now)
            self.summary_at = self.clock()
        return [{"id": None, "event": n, "data": self.summary[n]} for n in ("overview", "problems")]

    async def run(self) -> None:
        layer = get_channel_layer()
        while True:
            if self.idle():
                # Forget the position: a later subscriber reads its own backlog first.
                self.cursor, self.gaps, self.summary = None, {}, None
                if self.bus:
                    self.bus.close()
                self.bus = None
                return
            self._drain_wakes()  # wakes sent before this look are answered by it
            try:
                frames = await sync_to_async(self.collect)(timezone.now())
                for frame in frames:
                    await layer.group_send(self.group, {"type": "event.frame", "frame": frame})
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A locked database or a bad row must not end the stream for everyone.
                self.faults.failed(exc)
            else:
                self.faults.worked()
            await self._pause()

    def _wake_listener(self) -> wakebus.Listener | None:
        if self.bus is None:
            self.bus = wakebus.listen_or_none(wakebus.EVENTS) or False
        return self.bus or None

    def _drain_wakes(self) -> None:
        if listener := self._wake_listener():
            listener.drain()

    async def _pause(self) -> None:
        """The poll interval, cut short by a wake: an event committed in any process."""
        listener = self._wake_listener()
        if listener is None:
            await asyncio.sleep(self.poll)
            return
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        loop.add_reader(listener.fileno(), woken.set)
        try:
            await asyncio.wait_for(woken.wait(), timeout=self.poll)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(listener.fileno())

    def ensure_running(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())


_relays: dict[int, Relay] = {}


def relay() -> Relay:
    """This process's relay, one per event loop (daphne runs one)."""
    loop = asyncio.get_running_loop()
    found = _relays.get(id(loop))
    if found is None or (found.task is not None and found.task.get_loop() is not loop):
        found = _relays[id(loop)] = Relay()
    found.ensure_running()
    return found
