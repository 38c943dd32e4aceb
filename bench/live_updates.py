"""Live updates: V viewers on the event stream, and how long a change takes to reach them.

    .venv/bin/python -m bench.live_updates [--viewers 200] [--changes 20] [--json PATH]

A fresh controller (`manage.py controller --no-agent`, SQLite, through
tests/e2e/harness.Controller) and one pool made with `POST /api/v1/pools`. V viewers in
this process, asyncio and httpx, one connection each, open `GET /api/v1/events` with the
harness's API token (the e2e user's, minted by `manage.py create_token` with fleet:read and
fleet:write, as the end-to-end tests read the API). Once every stream has its first
overview frame, the pool is paused and resumed in turn over the API (`POST
/api/v1/pools/<id>/pause`, `.../resume`), `--changes` times, each after the one before
reached every viewer and a random pause of 0.3 to 0.8 s (so the changes do not keep one
phase against the relay's 0.5 s tail). Per change: seconds from sending the POST to the
first and to the last viewer receiving the pool frame that shows it (ms); p50 and p99 over
the changes, and over every (viewer, change).

The floor, in the same run, with the same client and V streams: bench/floor_sse.py under
daphne, a bare ASGI app that sends every open stream a frame of the same shape when it
receives a POST. The ratio is what the controller adds: the action and its outbox row,
the relay's tail of it, rendering the frame, and the channel layer's fan-out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    flush,
    load_average,
    machine,
    pct,
    sigterm_raises,
    stop_controller,
    table,
)
from bench.webhook_ingest import Floor  # noqa: E402
from tests.e2e.harness import Controller  # noqa: E402

# A stream is ready once it has this frame: the controller sends it right after the
# viewer joined the relay's group, so every later change reaches it.
READY_EVENT = "overview"
CHANGE_EVENT = "pool"
ARRIVAL_TIMEOUT = 20.0  # seconds a change may take to reach every viewer


@dataclass
class Change:
    index: int
    paused: bool
    sent: float  # perf_counter just before the POST
    answered: float = math.nan
    arrivals: dict[int, float] = field(default_factory=dict)  # viewer -> perf_counter


@dataclass
class Board:
    """What the viewers saw, shared by the tasks of one event loop."""

    viewers: int
    ready: set[int] = field(default_factory=set)
    current: Change | None = None
    changes: list[Change] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    all_ready: asyncio.Event = field(default_factory=asyncio.Event)

    def frame(self, viewer: int, event: str, data: str) -> None:
        if event == READY_EVENT and viewer not in self.ready:
            self.ready.add(viewer)
            if len(self.ready) == self.viewers:
                self.all_ready.set()
            return
        change = self.current
        if event != CHANGE_EVENT or change is None or viewer in change.arrivals:
            return
        shown = (json.loads(data).get("object") or {}).get("paused")
        if shown is change.paused:
            change.arrivals[viewer] = time.perf_counter()


async def viewer(client: httpx.AsyncClient, url: str, index: int, board: Board) -> None:
    """One SSE reader: frames are dispatched at each blank line (the SSE wire format)."""
    try:
        async with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as answer:
            if answer.status_code != 200:
                board.failures.append(f"viewer {index}: {answer.status_code}")
                return
            event, data = "", []
            async for line in answer.aiter_lines():
                if line:
                    name, _, value = line.partition(":")
                    if name == "event":
                        event = value.strip()
                    elif name == "data":
                        data.append(value.removeprefix(" "))
                    continue
                if event:
                    board.frame(index, event, "\n".join(data))
                event, data = "", []
    except httpx.HTTPError as exc:
        board.failures.append(f"viewer {index}: {exc!r}")


@dataclass
class Result:
    target: str
    viewers: int
    ready: int
    changes: int
    reached_all: int  # changes every viewer received
    first_p50_ms: float
    first_p99_ms: float
    last_p50_ms: float
    last_p99_ms: float
    every_p50_ms: float
    every_p99_ms: float
    answer_p50_ms: float  # the change's own POST
    connect_s: float  # until every stream had its first frame
    load: str
    failures: list[str]


async def measure(
    target: str, stream_url: str, headers: dict[str, str], viewers: int, changes: int,
    change: Callable[[httpx.AsyncClient, bool], Awaitable[None]],
) -> Result:  # fmt: skip
    board = Board(viewers)
    limits = httpx.Limits(max_connections=viewers + 8, max_keepalive_connections=viewers + 8)
    timeout = httpx.Timeout(60.0, read=None)  # a stream is read for as long as it lasts
    async with (
        httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as streams,
        httpx.AsyncClient(headers=headers, timeout=30.0) as poster,
    ):
        began = time.perf_counter()
        tasks = [asyncio.ensure_future(viewer(streams, stream_url, i, board))
                 for i in range(viewers)]  # fmt: skip
        try:
            await asyncio.wait_for(board.all_ready.wait(), timeout=180)
        except TimeoutError:
            board.failures.append(f"only {len(board.ready)} of {viewers} streams opened")
        connect = time.perf_counter() - began
        rng = random.Random(12)
        for k in range(changes if board.all_ready.is_set() else 0):
            current = Change(k, paused=k % 2 == 0, sent=time.perf_counter())
            board.current = current
            await change(poster, current.paused)
            current.answered = time.perf_counter()
            deadline = current.sent + ARRIVAL_TIMEOUT
            while len(current.arrivals) < viewers and time.perf_counter() < deadline:
                await asyncio.sleep(0.005)
            board.changes.append(current)
            board.current = None
            await asyncio.sleep(rng.uniform(0.3, 0.8))
        load = load_average()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    firsts, lasts, every, answers = [], [], [], []
    for c in board.changes:
        delays = sorted((t - c.sent) * 1000 for t in c.arrivals.values())
        answers.append((c.answered - c.sent) * 1000)
        if delays:
            firsts.append(delays[0])
            every.extend(delays)
        if len(delays) == viewers:
            lasts.append(delays[-1])
    return Result(
        target=target, viewers=viewers, ready=len(board.ready), changes=len(board.changes),
        reached_all=len(lasts), first_p50_ms=pct(firsts, 50), first_p99_ms=pct(firsts, 99),
        last_p50_ms=pct(lasts, 50), last_p99_ms=pct(lasts, 99), every_p50_ms=pct(every, 50),
        every_p99_ms=pct(every, 99), answer_p50_ms=pct(answers, 50), connect_s=connect,
        load=load, failures=board.failures[:5],
    )  # fmt: skip


def zoomies(viewers: int, changes: int, tmp: Path) -> Result:
    data_dir = Path(tempfile.mkdtemp(prefix="live-", dir=tmp))
    # Every viewer comes from 127.0.0.1, where real ones each have an address (and a
    # browser one stream): lift the per-address connection cap out of the way.
    controller = Controller(
        data_dir, env={"ZOOMIES_SERVER_MAX_CONNECTIONS_PER_CLIENT": str(max(64, viewers + 64))}
    )
    try:
        controller.start("--no-agent")
        pool = controller.api("pools", method="POST", json={
            "name": "zoomies-live", "labels": ["live"], "backend": "process",
            "image": "zoomies/fake-runner", "max_runners": 1,
        })["id"]  # fmt: skip
        time.sleep(2.0)  # let start-up passes finish

        async def change(client: httpx.AsyncClient, paused: bool) -> None:
            verb = "pause" if paused else "resume"
            answer = await client.post(f"{controller.url}/api/v1/pools/{pool}/{verb}")
            answer.raise_for_status()

        headers = {"Authorization": f"Bearer {controller.token}"}
        return asyncio.run(
            measure(
                "zoomies", f"{controller.url}/api/v1/events", headers, viewers, changes, change
            )  # fmt: skip
        )
    except BaseException:
        print(f"controller log (tail):\n{controller.log()}", file=sys.stderr)
        raise
    finally:
        stop_controller(controller)


def floor(viewers: int, changes: int, tmp: Path) -> Result:
    server = Floor(tmp / "floor-sse.log", "bench.floor_sse:application")
    try:
        server.wait_ready()
        base = f"http://127.0.0.1:{server.port}"

        async def change(client: httpx.AsyncClient, paused: bool) -> None:
            answer = await client.post(f"{base}/change?paused={int(paused)}")
            answer.raise_for_status()

        return asyncio.run(measure("floor", f"{base}/events", {}, viewers, changes, change))
    finally:
        server.stop()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--viewers", type=int, default=200)
    p.add_argument("--changes", type=int, default=20)
    p.add_argument("--json", type=Path, help="also write the results here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sigterm_raises()
    os.environ.pop("ZOOMIES_DATABASE_URL", None)
    print(f"machine: {machine()}")
    flush()
    results = []
    with tempfile.TemporaryDirectory(prefix="zoomies-bench-live-") as tmp:
        for run in (zoomies, floor):
            result = run(args.viewers, args.changes, Path(tmp))
            results.append(result)
            print(f"  {result.target}: {result.ready} of {result.viewers} streams open in "
                  f"{result.connect_s:.1f} s; {result.reached_all} of {result.changes} changes "
                  f"reached every viewer (load {result.load})"
                  + (f"; first failures: {result.failures}" if result.failures else ""),
                  flush=True)  # fmt: skip
    print()
    print("Milliseconds from the change's POST to its frame, p50 / p99 over the changes")
    print("(first and last viewer) and over every (viewer, change); the POST's answer beside:")
    print(table(
        ["target", "viewers", "changes", "first p50", "first p99", "last p50", "last p99",
         "every p50", "every p99", "POST answered p50"],
        [[r.target, r.viewers, r.changes, r.first_p50_ms, r.first_p99_ms, r.last_p50_ms,
          r.last_p99_ms, r.every_p50_ms, r.every_p99_ms, r.answer_p50_ms] for r in results],
    ))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    complete = all(r.ready == r.viewers and r.reached_all == r.changes for r in results)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
