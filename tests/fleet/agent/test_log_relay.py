"""The agent's log relay over the process backend (LOG-02, LOG-04): the output file followed
from its start to the runner's exit and posted in chunks, the last one `eof`; a controller
that answers nobody watches (404) stops the reader."""

from __future__ import annotations

import sys
import threading

from fleet import protocol
from fleet.agent.backends.base import RunnerSpec
from fleet.agent.backends.process import ProcessBackend
from fleet.agent.logs import LogRelay, handle_log_task

STREAM = "s" * 24


class Chunks:
    """A controller's log route: records each chunk; answers `open` until told not to."""

    def __init__(self, open_for: int | None = None) -> None:
        self.chunks: list[protocol.LogChunk] = []
        self.open_for = open_for
        self.lock = threading.Lock()

    def post_log_chunk(self, stream_id: str, chunk: protocol.LogChunk) -> bool:
        assert stream_id == STREAM
        with self.lock:
            self.chunks.append(chunk)
            if self.open_for is not None and len(self.chunks) >= self.open_for:
                return False
        return not chunk.eof

    def text(self) -> str:
        with self.lock:
            return "".join(c.data for c in self.chunks)


def start(tmp_path, script: str, controller: Chunks) -> tuple[ProcessBackend, LogRelay]:
    backend = ProcessBackend(tmp_path)
    backend.create(
        RunnerSpec(runner_id=3, runner_name="r3", pool="p", backend="process",
                   command=[sys.executable, "-c", script])
    )  # fmt: skip
    relay = LogRelay(controller)  # type: ignore[arg-type]
    ok, error = handle_log_task(
        "stream_logs", {"stream_id": STREAM}, 3, relay=relay, backend=backend
    )
    assert (ok, error) == (True, None)
    return backend, relay


def test_log02_the_whole_output_is_relayed_and_the_last_chunk_ends_the_stream(tmp_path):
    """LOG-02: everything the runner wrote, in order, across UTF-8 split anywhere; the relay
    ends by itself once the runner has exited and its file is read to the end."""
    script = "import sys\nfor n in range(2000): print(f'line {n} \u00e9t\u00e9')\n"
    controller = Chunks()
    backend, relay = start(tmp_path, script, controller)
    assert relay.wait_idle(30)
    assert relay.active() == []
    expected = "".join(f"line {n} \u00e9t\u00e9\n" for n in range(2000))
    assert controller.text() == expected
    assert controller.chunks[-1].eof and not any(c.eof for c in controller.chunks[:-1])
    assert all(len(c.data) <= protocol.MAX_LOG_CHUNK for c in controller.chunks)
    backend.remove(3)


def test_log04_nobody_watching_stops_the_reader_and_cancel_of_an_ended_relay_is_fine(tmp_path):
    """LOG-04: the controller's `open: false` (its viewers left) ends the relay while the
    runner keeps running; a cancel_logs arriving after that changes nothing."""
    script = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.05)\n"
    controller = Chunks(open_for=3)
    backend, relay = start(tmp_path, script, controller)
    assert relay.wait_idle(30)
    assert relay.active() == [] and len(controller.chunks) == 3
    ok, _ = handle_log_task("cancel_logs", {"stream_id": STREAM}, 3, relay=relay, backend=None)
    assert ok
    backend.remove(3)


def test_log02_a_runner_with_no_workload_here_says_so_on_the_stream(tmp_path):
    """The viewers learn at once: an eof chunk with the reason, and the task fails."""
    controller = Chunks()
    relay = LogRelay(controller)  # type: ignore[arg-type]
    ok, error = handle_log_task("stream_logs", {"stream_id": STREAM}, 9, relay=relay, backend=None)
    assert not ok and "no workload" in (error or "")
    (chunk,) = controller.chunks
    assert chunk.eof and chunk.error == error
    bad, why = handle_log_task("stream_logs", {"stream_id": "x"}, 9, relay=relay, backend=None)
    assert not bad and "unusable" in (why or "")
