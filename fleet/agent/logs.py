"""The agent's half of the log relay: follow a runner's output and POST it (LOG-02, LOG-04).

A `stream_logs` task starts a relay: one thread reads the backend's `follow_logs` into a
small bounded queue, another takes what has gathered there and POSTs it as one chunk to
`/api/v1/agent/logs/{stream_id}`, so a chatty runner costs a request per batch rather than
per line, and a quiet one's last line is sent at once rather than when the next arrives.
The relay ends when the output ends (the last chunk says `eof`), when the controller
answers that nobody watches any more, or on `cancel_logs`, which closes the backend's
stream under the reader. Nothing is kept: a relay is tied to viewers, and a restarted
agent has none.
"""

from __future__ import annotations

import codecs
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from fleet import protocol
from fleet.agent.backends.base import Backend, BackendError, LogFollow
from fleet.agent.client import ControllerClient, ControllerError

log = logging.getLogger("fleet.agent")

# What one POST carries at most, in bytes read (a chunk's text stays under the protocol's
# MAX_LOG_CHUNK characters whatever the bytes decode to).
CHUNK_BYTES = 48 * 1024
LOG_TASK_KINDS = ("stream_logs", "cancel_logs")
QUEUE_PIECES = 64  # pieces read ahead of the poster; then the reader waits (and the engine)
POST_ATTEMPTS = 3
_END = object()


class _Failed:
    def __init__(self, message: str) -> None:
        self.message = message


class LogRelay:
    """The streams this agent is relaying, by stream id."""

    def __init__(
        self, client: ControllerClient, *, sleep: Callable[[float], object] | None = None
    ) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._relays: dict[str, _Relay] = {}
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait

    def start(self, stream_id: str, runner_id: int, follow: LogFollow) -> None:
        """Relay `follow` to the stream; a second start of one stream id changes nothing."""
        with self._lock:
            if stream_id in self._relays:
                follow.close()
                return
            relay = _Relay(self, stream_id, runner_id, follow)
            self._relays[stream_id] = relay
        relay.start()

    def cancel(self, stream_id: str) -> bool:
        """LOG-04: stop reading; False when no such relay runs (it had ended already)."""
        with self._lock:
            relay = self._relays.pop(stream_id, None)
        if relay is None:
            return False
        relay.stop()
        return True

    def cancel_all(self) -> None:
        self._stopping.set()
        with self._lock:
            relays = list(self._relays.values())
            self._relays.clear()
        for relay in relays:
            relay.stop()

    def active(self) -> list[str]:
        with self._lock:
            return sorted(self._relays)

    def wait_idle(self, timeout: float) -> bool:
        """Wait for every relay's threads to finish; True when they have."""
        with self._lock:
            relays = list(self._relays.values())
        for relay in relays:
            relay.join(timeout)
        return not any(r.alive() for r in relays)

    def _done(self, relay: _Relay) -> None:
        with self._lock:
            if self._relays.get(relay.stream_id) is relay:
                del self._relays[relay.stream_id]


class _Relay:
    def __init__(self, owner: LogRelay, stream_id: str, runner_id: int, follow: LogFollow):
        self.owner = owner
        self.stream_id = stream_id
        self.runner_id = runner_id
        self.follow = follow
        self.pieces: queue.Queue[object] = queue.Queue(maxsize=QUEUE_PIECES)
        self.stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._read, name=f"agent-logs-read-{runner_id}", daemon=True),
            threading.Thread(target=self._post, name=f"agent-logs-post-{runner_id}", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.follow.close()

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _put(self, item: object) -> bool:
        while not self.stopped.is_set():
            try:
                self.pieces.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        try:
            for piece in self.follow:
                if not self._put(piece):
                    return
        except Exception as exc:  # the backend's failure, said to the viewers
            self._put(_Failed(f"reading runner {self.runner_id}'s output failed: {exc}"))
            return
        self._put(_END)

    def _post(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = bytearray()
        end: object = None  # _END or a _Failed once the reader has finished

        def absorb(item: object) -> None:
            nonlocal end
            if isinstance(item, bytes):
                pending.extend(item)
            else:
                end = item

        try:
            while not self.stopped.is_set():
                if not pending and end is None:
                    try:
                        absorb(self.pieces.get(timeout=0.5))
                    except queue.Empty:
                        continue
                # Whatever else has gathered meanwhile goes in the same POST.
                while len(pending) < CHUNK_BYTES and end is None:
                    try:
                        absorb(self.pieces.get_nowait())
                    except queue.Empty:
                        break
                piece = bytes(pending[:CHUNK_BYTES])
                del pending[:CHUNK_BYTES]
                eof = end is not None and not pending
                text = decoder.decode(piece, final=eof).replace("\x00", "\ufffd")
                error = end.message if eof and isinstance(end, _Failed) else None
                if not self._send(protocol.LogChunk(data=text, eof=eof, error=error)) or eof:
                    return
        finally:
            self.stop()
            self.owner._done(self)

    def _send(self, chunk: protocol.LogChunk) -> bool:
        """True while the stream is watched; False ends the relay (nobody watches, or the
        controller could not be told after POST_ATTEMPTS)."""
        delay = 1.0
        for attempt in range(POST_ATTEMPTS):
            if self.stopped.is_set():
                return False
            try:
                return self.owner.client.post_log_chunk(self.stream_id, chunk)
            except ControllerError as exc:
                log.warning("runner %s's log chunk was not taken: %s", self.runner_id, exc)
                if attempt + 1 < POST_ATTEMPTS:
                    self.owner._sleep(delay)
                    delay *= 2
        return False


def handle_log_task(
    kind: str,
    payload: dict[str, Any],
    runner_id: int,
    *,
    relay: LogRelay,
    backend: Backend | None,
) -> tuple[bool, str | None]:
    """A `stream_logs` or `cancel_logs` task: (ok, error). `backend` is the one holding the
    runner's workload, None when this host has none. A stream that cannot start says why
    on the stream itself, so its viewers learn it at once rather than from the task."""
    try:
        if kind == "cancel_logs":
            cancel = protocol.CancelLogsPayload.from_json(payload, runner_id=runner_id)
            relay.cancel(cancel.stream_id)
            return True, None
        stream = protocol.StreamLogsPayload.from_json(payload, runner_id=runner_id)
    except protocol.ProtocolError as exc:
        return False, f"the {kind} payload is unusable: {exc}"
    try:
        if backend is None:
            raise BackendError(f"runner {runner_id} has no workload on this host")
        follow = backend.follow_logs(runner_id)
    except BackendError as exc:
        try:
            relay.client.post_log_chunk(
                stream.stream_id, protocol.LogChunk(eof=True, error=str(exc))
            )
        except ControllerError as post_error:
            log.warning("could not tell runner %s's viewers: %s", runner_id, post_error)
        return False, str(exc)
    relay.start(stream.stream_id, runner_id, follow)
    return True, None
