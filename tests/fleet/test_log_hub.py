"""The log relay's hub (fleet/logs.py): shared streams, the last viewer's leaving, and the
bound on what a viewer that falls behind can cost (LOG-03, LOG-04, LOG-05)."""

from __future__ import annotations

import json

from fleet.logs import DROPPED, END, OUTPUT, LogHub

CHUNK = "x" * 48 * 1024 + "\n"  # one agent POST's worth


def nothing() -> None:
    pass


def test_log03_a_second_viewer_of_a_runner_joins_its_stream():
    """LOG-03: one stream per runner; the second viewer is told it did not open one."""
    hub = LogHub()
    first, opened = hub.join(7, host_id=1, wake=nothing)
    second, opened_again = hub.join(7, host_id=1, wake=nothing)
    other, opened_other = hub.join(8, host_id=1, wake=nothing)
    assert opened and not opened_again and opened_other
    assert first.stream is second.stream
    assert other.stream is not first.stream
    assert hub.deliver(first.stream.stream_id, 1, "hello\n") is True
    assert [f.text for f in hub.take(first)] == ["hello\n"]
    assert [f.text for f in hub.take(second)] == ["hello\n"]
    assert hub.take(other) == []


def test_log04_only_the_last_viewer_leaving_closes_the_stream():
    """LOG-04: leave() names the stream to cancel only for its last viewer; the agent's
    next chunk for it is then refused (None: answered 404, and the agent stops)."""
    hub = LogHub()
    first, _ = hub.join(7, host_id=1, wake=nothing)
    second, _ = hub.join(7, host_id=1, wake=nothing)
    stream_id = first.stream.stream_id
    assert hub.leave(first) is None
    assert hub.deliver(stream_id, 1, "still watched\n") is True
    assert hub.leave(second) is first.stream
    assert hub.deliver(stream_id, 1, "nobody\n") is None
    assert hub.stream_for(7) is None
    third, opened = hub.join(7, host_id=1, wake=nothing)
    assert opened and third.stream.stream_id != stream_id


def test_log02_a_chunk_from_another_host_or_after_the_end_is_refused():
    """A host may only feed its own runner's stream; eof ends it for every viewer."""
    hub = LogHub()
    viewer, _ = hub.join(7, host_id=1, wake=nothing)
    stream_id = viewer.stream.stream_id
    assert hub.deliver(stream_id, 2, "forged\n") is None
    assert hub.deliver(stream_id, 1, "last\n", eof=True) is False
    frames = hub.take(viewer)
    assert [(f.kind, f.text) for f in frames] == [
        (OUTPUT, "last\n"),
        (END, "the runner's output ended"),
    ]
    assert hub.deliver(stream_id, 1, "more\n") is None
    assert hub.leave(viewer) is None  # ended by the agent: nothing to cancel


def test_log05_a_viewer_that_never_reads_holds_its_bound_and_loses_bytes_with_a_marker():
    """LOG-05: 20 MB through a stream with one viewer that reads everything and one that
    never reads. What the hub holds never passes the never-reader's bound (counted after
    every chunk), the reader loses nothing, and the never-reader gets what fitted, then one
    marker with the exact count of the bytes it lost."""
    limit = 256 * 1024
    hub = LogHub(viewer_buffer=limit)
    wakes = {"reader": 0, "sleeper": 0}
    reader, _ = hub.join(7, host_id=1, wake=lambda: wakes.__setitem__("reader", 1))
    sleeper, _ = hub.join(7, host_id=1, wake=lambda: wakes.__setitem__("sleeper", 1))
    size = len(CHUNK.encode())
    chunks = 20 * 1024 * 1024 // size
    most_held = received = 0
    for _ in range(chunks):
        assert hub.deliver(reader.stream.stream_id, 1, CHUNK) is True
        most_held = max(most_held, hub.buffered_bytes())
        received += sum(f.size for f in hub.take(reader) if f.kind == OUTPUT)
    assert most_held <= limit + size  # the reader's one chunk, plus the sleeper's bound
    assert sleeper.buffered <= limit
    assert received == chunks * size
    frames = hub.take(sleeper)
    kept = [f for f in frames if f.kind == OUTPUT]
    markers = [f for f in frames if f.kind == DROPPED]
    assert len(kept) == limit // size
    assert len(markers) == 1 and frames[-1] is markers[0]
    assert markers[0].size == (chunks - len(kept)) * size == sleeper.dropped
    assert json.loads(markers[0].sse().decode().split("data: ")[1]) == {"bytes": markers[0].size}
    # Read again, it has room again: loss is never permanent for a viewer that catches up.
    hub.deliver(reader.stream.stream_id, 1, "after\n")
    assert [f.text for f in hub.take(sleeper)] == ["after\n"]
    assert wakes == {"reader": 1, "sleeper": 1}
