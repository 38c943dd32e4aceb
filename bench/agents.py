"""Agents at scale: N light agents on one controller, as remote hosts would be.

    .venv/bin/python -m bench.agents [--agents 100 500 1000 2000] [--hold 35] [--json PATH]

For each N, a fresh controller (`manage.py controller --no-agent`, SQLite, through
tests/e2e/harness.Controller) and N join tokens minted in one `manage.py shell`. Then N
asyncio agents in this process, each on two keep-alive HTTP/1.1 connections of its own
(written by hand on asyncio streams, so that the client costs little beside the
controller on the same cores): it joins (the joins start spread over `--ramp` seconds),
heartbeats at once and then every `--interval` seconds (30, the controller's default
heartbeat interval) with the body the real agent sends, and keeps a task long-poll
(`GET tasks?wait=25`) open the whole time, opening the next as soon as one returns.

After the last join the agents run `--hold` seconds more (past one whole heartbeat
interval, so every agent heartbeats at least twice). Figures: join and heartbeat latency
(p50, p99, max) and failures, the long-polls open at the end (of N), the controller's CPU
(cores busy, all its processes, over the hold), and the RSS and PSS of its whole process
tree at the end. The floor for the latencies is the controller's `/healthz` timed from the
same client in the same hold: what the server and this client cost with no work behind.

`--web N` runs each N again on the scale-out shape beside the single process, in the same
run (docs/deployment.md): N `manage.py web` processes sharing one port (SO_REUSEPORT) and
one `manage.py workers`, on PostgreSQL and Redis, all in one session so that CPU and memory
count every one of them. The agents are spread over the web processes by the kernel, one
connection at a time, as a load balancer would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    CpuSampler,
    flush,
    load_average,
    machine,
    own_cpu,
    pct,
    session_memory,
    sigterm_raises,
    stop_controller,
)
from bench.scale_out import ScaleOut  # noqa: E402
from tests.e2e.harness import Controller  # noqa: E402

AGENT_API = "/api/v1/agent"
MINT = (
    "import sys\n"
    "from datetime import timedelta\n"
    "from django.utils import timezone\n"
    "from fleet.actions import create_join_token\n"
    "for _ in range({n}):\n"
    "    sys.stdout.write(create_join_token(now=timezone.now(), actor='bench', "
    "ttl=timedelta(hours=2))[1] + '\\n')\n"
)


class NotAnswered(ConnectionError):
    """The connection was closed before any byte of an answer came back."""


class Connection:
    """One keep-alive HTTP/1.1 connection; reopened after any error.

    Like any HTTP client's pool, a request that finds its kept-alive connection closed by
    the server (which idles connections out) before any byte of an answer is sent again
    once on a fresh connection.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", token: str = "", timeout: float = 60
    ) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._request(method, path, body, token), timeout)
        except BaseException:
            self.close()
            raise

    async def _request(self, method: str, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        reused = self.writer is not None
        try:
            return await self._exchange(method, path, body, token)
        except NotAnswered:
            if not reused:
                raise
            self.close()
            return await self._exchange(method, path, body, token)

    async def _exchange(self, method: str, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.reader, self.writer
        head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}"]
        if token:
            head.append(f"Authorization: Bearer {token}")
        if body or method == "POST":
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            status_line = await reader.readline()
        except ConnectionError as exc:
            raise NotAnswered(repr(exc)) from exc
        if not status_line:
            raise NotAnswered("the server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        payload = await reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Totals:
    joins: list[float] = field(default_factory=list)
    join_errors: int = 0
    heartbeats: list[float] = field(default_factory=list)
    # When each of those began (time.monotonic()), to tell the joins' ramp from the hold.
    heartbeat_starts: list[float] = field(default_factory=list)
    heartbeat_errors: int = 0
    healthz: list[float] = field(default_factory=list)
    polls_open: int = 0
    poll_errors: int = 0
    first_error: str = ""

    def error(self, what: str) -> None:
        self.first_error = self.first_error or what


def heartbeat_body(name: str) -> bytes:
    return json.dumps(
        {
            "capacity": 4,
            "backends": ["process"],
            "platform": "linux/x64",
            "cpus": 4.0,
            "memory_mb": 8192,
            "labels": {"bench": "yes"},
            "version": "bench",
            "disk_total_mb": 100000,
            "disk_free_mb": 50000,
            "usage": {"cpu_percent": 1.0, "memory_used_mb": 100, "load1": 0.1},
        }  # fmt: skip
    ).encode()


async def agent(
    index: int, port: int, token: str, start_at: float, interval: float, stop: asyncio.Event,
    totals: Totals, joined: list[int],
) -> None:  # fmt: skip
    name = f"bench-agent-{index}"
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    beats, polls = Connection(port), Connection(port)
    body = json.dumps({
        "join_token": token, "name": name, "platform": "linux/x64", "backends": ["process"],
        "capacity": 4, "cpus": 4.0, "memory_mb": 8192, "labels": {"bench": "yes"},
        "version": "bench",
    }).encode()  # fmt: skip
    began = time.perf_counter()
    try:
        status, answer = await beats.request("POST", f"{AGENT_API}/join", body)
    except (TimeoutError, OSError, ValueError) as exc:
        status, answer = 0, repr(exc).encode()
    if status != 200:
        totals.join_errors += 1
        totals.error(f"join: {status} {answer[:200]!r}")
        return
    totals.joins.append(time.perf_counter() - began)
    agent_token = json.loads(answer)["agent_token"]
    joined.append(index)
    poller = asyncio.ensure_future(long_poll(polls, agent_token, stop, totals))
    beat = heartbeat_body(name)
    try:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                status, answer = await beats.request(
                    "POST", f"{AGENT_API}/heartbeat", beat, agent_token
                )
            except (TimeoutError, OSError, ValueError) as exc:
                status, answer = 0, repr(exc).encode()
            if status == 200:
                totals.heartbeats.append(time.perf_counter() - began)
                totals.heartbeat_starts.append(time.monotonic() - (time.perf_counter() - began))
            else:
                totals.heartbeat_errors += 1
                totals.error(f"heartbeat: {status} {answer[:200]!r}")
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass
    finally:
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
        beats.close()
        polls.close()


async def long_poll(conn: Connection, token: str, stop: asyncio.Event, totals: Totals) -> None:
    while not stop.is_set():
        totals.polls_open += 1
        try:
            status, answer = await conn.request(
                "GET", f"{AGENT_API}/tasks?wait=25", token=token, timeout=60
            )
        except (TimeoutError, OSError, ValueError) as exc:
            status, answer = 0, repr(exc).encode()
        finally:
            totals.polls_open -= 1
        if status != 200:
            totals.poll_errors += 1
            totals.error(f"tasks: {status} {answer[:200]!r}")
            await asyncio.sleep(1.0)


async def healthz_probe(port: int, stop: asyncio.Event, totals: Totals) -> None:
    """The floor: the controller's /healthz from this client, twice a second."""
    conn = Connection(port)
    while not stop.is_set():
        began = time.perf_counter()
        try:
            status, _ = await conn.request("GET", "/healthz", timeout=30)
            if status == 200:
                totals.healthz.append(time.perf_counter() - began)
        except (TimeoutError, OSError, ValueError):
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
    conn.close()


@dataclass
class Result:
    agents: int
    joined: int
    join_errors: int
    join_p50_ms: float
    join_p99_ms: float
    heartbeats: int
    heartbeat_errors: int
    heartbeat_p50_ms: float
    heartbeat_p99_ms: float
    heartbeat_max_ms: float
    # The heartbeats begun in the hold, after every join: the fleet's steady state.
    held_heartbeats: int
    held_heartbeat_p99_ms: float
    healthz_p50_ms: float
    healthz_p99_ms: float
    polls_open: int
    poll_errors: int
    controller_cpu_cores: float
    client_cpu_cores: float
    rss_mb: float
    pss_mb: float
    processes: int
    hold_s: float
    load: str
    first_error: str
    controller_alive: bool = True  # False: the controller exited during the run
    shape: str = "single process"


async def drive(controller: Controller, tokens: list[str], args) -> Result:
    totals, joined = Totals(), []
    stop = asyncio.Event()
    n = len(tokens)
    t0 = time.monotonic()
    tasks = [
        asyncio.ensure_future(
            agent(
                i,
                controller.port,
                token,
                t0 + args.ramp * i / n,
                args.interval,
                stop,
                totals,
                joined,
            )
        )  # fmt: skip
        for i, token in enumerate(tokens)
    ]
    # Every join answered or failed, or the ramp long over.
    deadline = t0 + args.ramp + 120
    while len(totals.joins) + totals.join_errors < n and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    probe = asyncio.ensure_future(healthz_probe(controller.port, stop, totals))
    cpu = CpuSampler(controller.process.pid, every=1.0)
    cpu_before, own_before, hold_began = cpu.total(), own_cpu(), time.monotonic()
    await asyncio.sleep(args.hold)
    held = time.monotonic() - hold_began
    controller_cpu = (cpu.total() - cpu_before) / held
    client_cpu = (own_cpu() - own_before) / held
    polls_open = totals.polls_open
    memory = session_memory(controller.process.pid)
    load = load_average()
    cpu.stop()
    stop.set()
    await asyncio.gather(*tasks, probe, return_exceptions=True)
    beats = [x * 1000 for x in totals.heartbeats]
    held_beats = [
        x * 1000
        for x, began in zip(totals.heartbeats, totals.heartbeat_starts, strict=True)
        if began >= hold_began
    ]
    joins = [x * 1000 for x in totals.joins]
    healthz = [x * 1000 for x in totals.healthz]
    return Result(
        agents=n,
        joined=len(joined),
        join_errors=totals.join_errors,
        join_p50_ms=pct(joins, 50),
        join_p99_ms=pct(joins, 99),
        heartbeats=len(beats),
        heartbeat_errors=totals.heartbeat_errors,
        heartbeat_p50_ms=pct(beats, 50),
        heartbeat_p99_ms=pct(beats, 99),
        heartbeat_max_ms=max(beats) if beats else float("nan"),
        held_heartbeats=len(held_beats),
        held_heartbeat_p99_ms=pct(held_beats, 99),
        healthz_p50_ms=pct(healthz, 50),
        healthz_p99_ms=pct(healthz, 99),
        polls_open=polls_open,
        poll_errors=totals.poll_errors,
        controller_cpu_cores=controller_cpu,
        client_cpu_cores=client_cpu,
        rss_mb=sum(m[2] for m in memory),
        pss_mb=sum(m[3] for m in memory),
        processes=len(memory),
        hold_s=held,
        load=load,
        first_error=totals.first_error,
    )


def run_one(n: int, args, tmp: Path, web: int = 0) -> Result:
    """N agents on a fresh server: the single process (`web` 0, SQLite) or the scale-out
    shape with `web` web processes (bench/scale_out.py)."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"agents{n}-web{web}-", dir=tmp))
    # Every agent here comes from 127.0.0.1 with two connections, where real hosts each have
    # an address of their own: lift the per-address connection cap out of the way.
    env = {"ZOOMIES_SERVER_MAX_CONNECTIONS_PER_CLIENT": str(max(64, 4 * n))}
    server = ScaleOut(data_dir, web, env=env) if web else Controller(data_dir, env=env)
    try:
        server.prepare()
        tokens = server.manage("shell", "-c", MINT.format(n=n)).split()
        tokens = [t for t in tokens if t.startswith("zjt_")]
        if len(tokens) != n:
            raise RuntimeError(f"minted {len(tokens)} join tokens of {n}")
        server.start("--no-agent")
        time.sleep(2.0)  # let start-up passes finish
        result = asyncio.run(drive(server, tokens, args))
        result.controller_alive = server.process is not None and server.process.poll() is None
        if web:
            result.shape = server.shape
        if args.logs:
            # The server's log, where a failed request says why.
            args.logs.mkdir(parents=True, exist_ok=True)
            (args.logs / f"agents-{n}-web{web}.log").write_text(
                server.log_path.read_text(errors="replace")
            )
        return result
    except BaseException:
        print(f"server log (tail):\n{server.log()}", file=sys.stderr)
        raise
    finally:
        stop_controller(server)
        if web:
            server.drop_database()


def run(counts: list[int], args) -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory(prefix="zoomies-bench-agents-") as tmp:
        for n in counts:
            for web in [0] + ([args.web] if args.web else []):
                results.append(run_one(n, args, Path(tmp), web))
            for result in results[-(2 if args.web else 1) :]:
                _print(n, result)
    return results


def _print(n: int, result: Result) -> None:
    print(
        f"  {n} agents ({result.shape}): {result.joined} joined ({result.join_errors} failed), "
        f"heartbeat p50 {result.heartbeat_p50_ms:.0f} / p99 {result.heartbeat_p99_ms:.0f}"
        f" ms over {result.heartbeats} (p99 {result.held_heartbeat_p99_ms:.0f} ms over the"
        f" {result.held_heartbeats} after the joins), /healthz p99"
        f" {result.healthz_p99_ms:.0f} ms, long-polls"
        f" open {result.polls_open}, server {result.controller_cpu_cores:.2f} cores, PSS "
        f"{result.pss_mb:.0f} MB in {result.processes} processes (load {result.load})"
        + ("" if result.controller_alive else "; THE SERVER EXITED during the run")
        + (f"; first error: {result.first_error}" if result.first_error else ""),
        flush=True,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, nargs="+", default=[100, 500, 1000, 2000])
    p.add_argument("--ramp", type=float, default=10.0, help="seconds the joins spread over")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between heartbeats")
    p.add_argument("--hold", type=float, default=35.0, help="seconds to run after the joins")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--logs", type=Path, help="keep each controller's log in this directory")
    p.add_argument(
        "--web",
        type=int,
        default=0,
        help="also run each N on this many web processes (PostgreSQL and Redis)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sigterm_raises()
    os.environ.pop("ZOOMIES_DATABASE_URL", None)
    print(f"machine: {machine()}")
    flush()
    results = run(args.agents, args)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    # Failed joins and heartbeats are figures, not a failure of the benchmark.
    return 0


if __name__ == "__main__":
    sys.exit(main())
