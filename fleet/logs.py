"""The log relay's hub: who follows which runner's output, in this web process (LOG-01..05).

One stream per runner being watched. The first viewer opens it (the caller then sends the
runner's host a `stream_logs` task carrying the stream id); a second viewer of that runner
joins it, so the host reads the output once however many browsers watch (LOG-03); the last
viewer leaving closes it (the caller sends `cancel_logs`, LOG-04). The agent POSTs chunks to
`/api/v1/agent/logs/{stream_id}` and `deliver` hands each to every viewer's queue.

Each viewer's queue is bounded in bytes (LOG-05): a chunk that does not fit is dropped
whole, and a marker saying how many bytes were lost takes its place in the queue, so a
viewer that reads slowly sees where it lost output and one that never reads costs at most
its bound. Nothing here waits on a viewer: `deliver` only appends and wakes.

The hub is per process. With SQLite the controller runs one web process (daphne), which
takes both the browsers' streams and the agents' POSTs, so that is the whole relay. With
several web processes (PostgreSQL scale-out) an agent's chunk may reach a process whose hub
has never heard of the stream: it is answered 404 and the agent stops reading, so the
viewer's stream shows nothing; relaying between processes (through the channel layer) is
not built.

Thread-safe: state is changed under one lock, and a viewer is woken through the callable it
was given (`loop.call_soon_threadsafe(event.set)` for an async view), so `deliver` may be
called from any thread or event loop. No Django, no I/O.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# LOG-05: what one viewer may have waiting. A chunk is at most protocol.MAX_LOG_CHUNK
# characters (up to four bytes each), so an empty queue always has room for one.
VIEWER_BUFFER_BYTES = 256 * 1024
OUTPUT, DROPPED, END = "output", "dropped", "end"


@dataclass
class Frame:
    """One thing a viewer is sent: output text, a count of lost bytes, or the end."""

    kind: str
    text: str = ""
    size: int = 0  # output: its UTF-8 bytes; dropped: the bytes lost

    def sse(self) -> bytes:
        """The frame as one server-sent event (JSON data: a newline cannot split it)."""
        if self.kind == OUTPUT:
            data: dict = {"text": self.text}
        elif self.kind == DROPPED:
            data = {"bytes": self.size}
        else:
            data = {"reason": self.text}
        return sse_event(self.kind, data)


def sse_event(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class Viewer:
    """One browser's queue on a stream. Changed only under the hub's lock."""

    def __init__(self, stream: Stream, limit: int, wake: Callable[[], None]) -> None:
        self.stream = stream
        self.limit = limit
        self._wake = wake
        self._frames: deque[Frame] = deque()
        self.buffered = 0  # bytes of output waiting
        self.dropped = 0  # bytes lost in all
        self.ended: str | None = None

    def _offer(self, text: str, size: int) -> None:
        if size <= self.limit - self.buffered:
            self._frames.append(Frame(OUTPUT, text, size))
            self.buffered += size
        else:
            # LOG-05: dropped whole, and said so where it happened; consecutive losses
            # share one marker, so markers never outnumber the output between them.
            last = self._frames[-1] if self._frames else None
            if last is not None and last.kind == DROPPED:
                last.size += size
            else:
                self._frames.append(Frame(DROPPED, size=size))
            self.dropped += size
        self._wake()

    def _end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
            self._wake()


@dataclass(eq=False)
class Stream:
    """One runner's output on its way from its host to the viewers."""

    stream_id: str
    runner_id: int
    host_id: int
    viewers: set[Viewer] = field(default_factory=set)
    task_id: int | None = None  # the stream_logs task, once it is written
    closed: bool = False


class LogHub:
    """The streams of this process, by runner and by stream id."""

    def __init__(self, viewer_buffer: int = VIEWER_BUFFER_BYTES) -> None:
        self.viewer_buffer = viewer_buffer
        self._lock = threading.Lock()
        self._by_runner: dict[int, Stream] = {}
        self._by_id: dict[str, Stream] = {}

    def join(self, runner_id: int, host_id: int, wake: Callable[[], None]) -> tuple[Viewer, bool]:
        """A viewer on the runner's stream, and whether this call opened the stream (then
        the caller sends the host its `stream_logs` task); a second viewer joins (LOG-03)."""
        with self._lock:
            stream = self._by_runner.get(runner_id)
            opened = stream is None or stream.host_id != host_id
            if opened:
                if stream is not None:  # the runner's row moved hosts: the old one is stale
                    self._close(stream, "the runner moved to another host")
                stream = Stream(secrets.token_urlsafe(18), runner_id, host_id)
                self._by_runner[runner_id] = stream
                self._by_id[stream.stream_id] = stream
            assert stream is not None  # noqa: S101  # narrows the type; the code above guarantees it
            viewer = Viewer(stream, self.viewer_buffer, wake)
            stream.viewers.add(viewer)
            return viewer, opened

    def leave(self, viewer: Viewer) -> Stream | None:
        """Take the viewer off its stream; the stream when that was its last viewer and it
        was still open (the caller then sends `cancel_logs`, LOG-04)."""
        with self._lock:
            stream = viewer.stream
            stream.viewers.discard(viewer)
            if stream.viewers or stream.closed:
                return None
            self._forget(stream)
            stream.closed = True
            return stream

    def take(self, viewer: Viewer) -> list[Frame]:
        """Everything waiting for the viewer, in order, and its end after that."""
        with self._lock:
            frames = list(viewer._frames)
            viewer._frames.clear()
            viewer.buffered = 0
            if viewer.ended is not None:
                frames.append(Frame(END, viewer.ended))
            return frames

    def deliver(
        self, stream_id: str, host_id: int, data: str, *, eof: bool = False, error: str = ""
    ) -> bool | None:
        """Hand a chunk to the stream's viewers (LOG-02). True: still watched; False: it
        ended with this chunk; None: no such stream of this host's (cancelled, ended, or
        never opened here)."""
        with self._lock:
            stream = self._by_id.get(stream_id)
            if stream is None or stream.closed or stream.host_id != host_id:
                return None
            if data:
                size = len(data.encode("utf-8", errors="replace"))
                for viewer in stream.viewers:
                    viewer._offer(data, size)
            if eof:
                self._close(stream, error or "the runner's output ended")
                return False
            return True

    def end(self, stream: Stream, reason: str) -> None:
        """End a stream from the controller's side (its task failed, the host is gone)."""
        with self._lock:
            if not stream.closed:
                self._close(stream, reason)

    def set_task(self, stream: Stream, task_id: int) -> None:
        with self._lock:
            stream.task_id = task_id

    # -- what tests and the bench measure ---------------------------------------------------

    def buffered_bytes(self) -> int:
        """Bytes of output waiting in every viewer's queue: what the relay holds."""
        with self._lock:
            return sum(v.buffered for s in self._by_id.values() for v in s.viewers)

    def stream_for(self, runner_id: int) -> Stream | None:
        with self._lock:
            return self._by_runner.get(runner_id)

    # -- under the lock ---------------------------------------------------------------------

    def _close(self, stream: Stream, reason: str) -> None:
        stream.closed = True
        self._forget(stream)
        for viewer in stream.viewers:
            viewer._end(reason)

    def _forget(self, stream: Stream) -> None:
        if self._by_runner.get(stream.runner_id) is stream:
            del self._by_runner[stream.runner_id]
        self._by_id.pop(stream.stream_id, None)


# This process's hub: the browsers' streams and the agents' POSTs meet here.
hub = LogHub()
