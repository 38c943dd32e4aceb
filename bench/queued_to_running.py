"""Queued to running: how fast the fleet starts runners for a burst of queued jobs.

PEERS.md point 7: GARM takes 5.8 s from a queued webhook to its first create and 11.6 s for
a burst of 200. Here a real controller (`manage.py controller` with its embedded agent and
the process backend, through tests/e2e/harness.Controller) serves a fake GitHub in this
process, as tests/e2e/conftest.py's `e2e` fixture wires them: the fake sends signed
deliveries to the controller, the controller mints JIT configurations at the fake, the
agent starts one fake runner process per job, the runner takes its job from the fake.

For each burst size B (a fresh controller and database each, pool `zoomies-bench` with
max_runners B, agent capacity B) one warm-up job runs first, so the burst meets a
controller that has its installation token, as a long-running one does; then B jobs of
about 1 s are queued at once. Per job, from the moment it was queued:

* delivered: the controller answered the job's `queued` delivery (the fake sends its
  deliveries one at a time, so in a burst each waits for those before it; --senders N
  sends with N threads);
* JIT minted, process created, runner online: the k-th JIT mint, runner process and runner
  session after the burst started, paired with the k-th queued job (an ephemeral runner
  is not bound to a job; the fake hands each to the oldest queued job it can take);
* in progress: the fake gave the job to a runner; completed: the runner finished it.

The fake's hooks are timed by subclassing it (its ISO timestamps have whole seconds), and
its own API handler time is reported, to show the fake is not the bottleneck (PEERS.md
point 12). Every runner process is a Python process (plus its supervisor shim), so a
burst of 50 costs real CPU: the CPU use of the machine during each burst is printed.

    .venv/bin/python bench/queued_to_running.py [--bursts 1 10 50] [--duration 1.0]
                                                [--senders 1] [--fake-backlog 128]
                                                [--no-warmup] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    CpuSampler,
    cpu_jiffies,
    drop_postgres,
    flush,
    kill_leftovers,
    listen_overflows,
    load_average,
    machine,
    own_cpu,
    pct,
    sigterm_raises,
    stop_controller,
    table,
)
from runners.github.fake import server as fake_server  # noqa: E402
from runners.github.fake.server import FakeGitHub  # noqa: E402
from tests.e2e.harness import Controller, wait_for  # noqa: E402

SECRET = "bench-secret"
ACCOUNT = "acme"
REPO = "acme/app"
LABELS = ["self-hosted", "bench"]
POSTGRES_URL = "postgres://root@127.0.0.1:5432/test"
FAKE_RUNNER_IMAGE = "zoomies/fake-runner"  # runners.reconcile.FAKE_RUNNER_IMAGE


class TimedFake(FakeGitHub):
    """The fake GitHub, noting (time.time()) when each thing the benchmark measures happens.

    The hooks wrap the fake's own handlers, which run under its lock; nothing else changes.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks_lock = threading.Lock()
        self.mints: list[float] = []
        self.sessions: list[float] = []
        self.started: dict[int, float] = {}
        self.completed: dict[int, float] = {}
        self.delivered: dict[int, tuple[float, int | None]] = {}
        self.api_calls = 0
        self.api_seconds = 0.0

    def _generate_jitconfig(self, req):
        response = super()._generate_jitconfig(req)
        with self.marks_lock:
            self.mints.append(time.time())
        return response

    def _open_session(self, req):
        response = super()._open_session(req)
        if response.status == 201:
            with self.marks_lock:
                self.sessions.append(time.time())
        return response

    def _start(self, job, runner):
        super()._start(job, runner)
        self.started[job.id] = time.time()

    def _finish(self, job, conclusion):
        super()._finish(job, conclusion)
        self.completed[job.id] = time.time()

    def _record(self, delivery_id, job_id, action, status, error):
        super()._record(delivery_id, job_id, action, status, error)
        if action == "queued":
            with self.marks_lock:
                self.delivered.setdefault(job_id, (time.time(), status))

    def _github(self, req):
        began = time.perf_counter()
        try:
            return super()._github(req)
        finally:
            with self.marks_lock:
                self.api_calls += 1
                self.api_seconds += time.perf_counter() - began

    def add_senders(self, count: int) -> None:
        """More delivery threads beside the fake's one (GitHub does not send one at a time);
        they share its outbox, so a job's deliveries may then arrive out of order."""
        for _ in range(count):
            thread = threading.Thread(target=self._send_loop, daemon=True)
            self._threads.append(thread)
            thread.start()

    def reset_marks(self) -> None:
        with self.marks_lock:
            self.mints.clear()
            self.sessions.clear()
            self.api_calls, self.api_seconds = 0, 0.0


class ProcessWatch:
    """Notes each runner process the agent creates: meta.json's `started_at`, written by the
    process backend at create, read before the runner's directory is cleaned away.

    The embedded agent's process backend keeps runners in `<data dir>/agent/work/runners/`
    (fleet/embedded.py, fleet/agent/cli.py, fleet/agent/backends/process.py).
    """

    def __init__(self, data_dir: Path):
        self.runners_dir = data_dir / "agent" / "work" / "runners"
        self.created: dict[str, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.02):
            try:
                names = os.listdir(self.runners_dir)
            except OSError:
                continue
            for name in names:
                if name in self.created:
                    continue
                try:
                    meta = json.loads((self.runners_dir / name / "meta.json").read_text())
                    self.created[name] = float(meta["started_at"])
                except (OSError, ValueError, KeyError, TypeError):
                    pass  # not written yet, half-written, or already gone

    def since(self, t0: float) -> list[float]:
        return sorted(t for t in list(self.created.values()) if t >= t0)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)


@dataclass
class Burst:
    size: int
    queued: dict[int, float] = field(default_factory=dict)
    delivered: list[float] = field(default_factory=list)
    minted: list[float] = field(default_factory=list)
    created: list[float] = field(default_factory=list)
    online: list[float] = field(default_factory=list)
    in_progress: list[float] = field(default_factory=list)
    completed: list[float] = field(default_factory=list)
    first_create: float = float("nan")
    creates_per_second: float = float("nan")
    first_mint: float = float("nan")
    total: float = float("nan")
    done: int = 0
    failed_deliveries: int = 0
    machine_busy: float = float("nan")  # average busy CPUs during the burst
    controller_cpu: dict[str, float] = field(default_factory=dict)
    bench_cpu: float = 0.0
    fake_calls: int = 0
    fake_busy: float = 0.0
    warmup: float = float("nan")
    overflows: int = 0
    load_before: str = ""

    def rows(self) -> list[list[object]]:
        rows = []
        for name, values in (
            ("delivered", self.delivered),
            ("JIT minted (k-th)", self.minted),
            ("process created (k-th)", self.created),
            ("runner online (k-th)", self.online),
            ("in progress", self.in_progress),
            ("completed", self.completed),
        ):
            rows.append([self.size, name, len(values), pct(values, 50), pct(values, 95),
                         max(values) if values else float("nan")])  # fmt: skip
        return rows


def paired(marks: list[float], queued_at: list[float]) -> list[float]:
    """The k-th mark after the burst began minus the k-th queue time."""
    marks = sorted(m for m in marks if m >= queued_at[0])
    return [m - q for m, q in zip(marks, queued_at, strict=False)]


def run_burst(args, size: int, tmp: Path) -> Burst:
    burst = Burst(size)
    fake = TimedFake(webhook_url=None, webhook_secret=SECRET).start()
    fake.add_senders(args.senders - 1)
    key = tmp / "app.pem"
    key.write_text(fake.private_key_pem)
    # A unique name: with PostgreSQL the harness names (and first drops) a database after it.
    data_dir = Path(tempfile.mkdtemp(prefix=f"burst{size}-", dir=tmp))
    controller = Controller(
        data_dir,
        env={
            "ZOOMIES_GITHUB_API_URL": fake.url,
            "ZOOMIES_GITHUB_APP_ID": str(fake.app_id),
            "ZOOMIES_GITHUB_PRIVATE_KEY_FILE": str(key),
            "ZOOMIES_GITHUB_WEBHOOK_SECRETS": SECRET,
        },
    )
    fake.webhook_url = f"{controller.url}/webhooks/github"
    watch = ProcessWatch(data_dir)
    cpu = None
    try:
        installation = fake.add_installation(account=ACCOUNT, repositories=[REPO])
        controller.prepare()
        controller.manage(
            "add_installation", "--id", str(installation), "--account", ACCOUNT, "--repo", REPO
        )
        controller.start("--agent-capacity", str(max(size, 1)))
        controller.api("pools", method="POST", json={
            "name": "zoomies-bench", "labels": ["bench"], "backend": "process",
            "image": FAKE_RUNNER_IMAGE, "max_runners": size,
        })  # fmt: skip
        wait_for(lambda: controller.api("hosts"), 30, "the embedded agent to join")
        if args.warmup:
            began = time.time()
            job = fake.queue_job(repo=REPO, labels=LABELS, duration=0.1)
            wait_for(lambda: job in fake.completed, 60, "the warm-up job", every=0.05)
            burst.warmup = fake.started[job] - began
            wait_for(lambda: not controller.api("runners"), 30, "the warm-up runner's reap")
        time.sleep(1.0)  # let the passes the warm-up woke finish
        fake.reset_marks()
        burst.load_before = load_average()
        cpu = CpuSampler(controller.process.pid)
        cpu_before, own_before, (busy0, total0) = cpu.by_role(), own_cpu(), cpu_jiffies()
        overflows_before = listen_overflows()

        queued_at = []
        for _ in range(size):
            t = time.time()
            job_id = fake.queue_job(repo=REPO, labels=LABELS, duration=args.duration)
            burst.queued[job_id] = t
            queued_at.append(t)
        deadline = time.time() + args.timeout
        while time.time() < deadline:
            if all(j in fake.completed for j in burst.queued):
                break
            time.sleep(0.02)
        ended = time.time()

        burst.overflows = listen_overflows() - overflows_before
        busy1, total1 = cpu_jiffies()
        burst.machine_busy = (busy1 - busy0) / max(total1 - total0, 1) * os.cpu_count()
        cpu_after = cpu.by_role()
        burst.controller_cpu = {
            role: cpu_after.get(role, 0.0) - cpu_before.get(role, 0.0) for role in cpu_after
        }
        burst.bench_cpu = own_cpu() - own_before
        burst.fake_calls, burst.fake_busy = fake.api_calls, fake.api_seconds

        t0 = queued_at[0]
        burst.done = sum(1 for j in burst.queued if j in fake.completed)
        for job_id, t in burst.queued.items():
            delivered = fake.delivered.get(job_id)
            if delivered is not None:
                burst.delivered.append(delivered[0] - t)
                burst.failed_deliveries += delivered[1] not in (200, 202)
            if job_id in fake.started:
                burst.in_progress.append(fake.started[job_id] - t)
            if job_id in fake.completed:
                burst.completed.append(fake.completed[job_id] - t)
        burst.minted = paired(fake.mints, queued_at)
        burst.created = paired(watch.since(t0), queued_at)
        burst.online = paired(fake.sessions, queued_at)
        burst.first_mint = burst.minted[0] if burst.minted else float("nan")
        burst.first_create = burst.created[0] if burst.created else float("nan")
        created = watch.since(t0)
        if len(created) > 1 and created[-1] > created[0]:
            burst.creates_per_second = (len(created) - 1) / (created[-1] - created[0])
        burst.total = (max(fake.completed.get(j, ended) for j in burst.queued)) - t0
        return burst
    except BaseException:
        print(f"controller log (tail):\n{controller.log()}", file=sys.stderr)
        raise
    finally:
        if cpu is not None:
            cpu.stop()
        watch.stop()
        stop_controller(controller)
        fake.stop()
        kill_leftovers(str(data_dir))
        drop_postgres(controller)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--duration", type=float, default=1.0, help="seconds each job runs")
    parser.add_argument("--timeout", type=float, default=120.0, help="per burst, seconds")
    parser.add_argument(
        "--senders", type=int, default=1, help="threads the fake sends deliveries with (its own: 1)"
    )
    parser.add_argument(
        "--fake-backlog",
        type=int,
        default=128,
        help="the fake's listen backlog (socketserver's default, 5, drops "
        "connects in a burst; each costs a 1 s retransmit)",
    )
    parser.add_argument("--no-warmup", dest="warmup", action="store_false")
    parser.add_argument("--postgres", action="store_true", help=f"use {POSTGRES_URL}")
    parser.add_argument("--postgres-url", default=POSTGRES_URL, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # The fake is a socketserver, whose listen backlog is 5: in a burst (8 concurrent mints
    # plus every runner's connections) a full queue drops a connect, and the client's SYN is
    # retried a second later, which stalls a whole pass (PEERS.md point 12). GitHub does
    # not drop connects, so the benchmark gives the fake a real backlog unless told not to.
    fake_server._Server.request_queue_size = args.fake_backlog
    sigterm_raises()
    if args.postgres:
        os.environ["ZOOMIES_DATABASE_URL"] = args.postgres_url
    else:
        os.environ.pop("ZOOMIES_DATABASE_URL", None)

    print(f"machine: {machine()}")
    database = "PostgreSQL" if args.postgres else "SQLite (WAL)"
    print(f"database: {database}; job duration {args.duration} s; warm-up job first: "
          f"{'yes' if args.warmup else 'no'}; delivery threads: {args.senders}; "
          f"fake listen backlog: {args.fake_backlog}")  # fmt: skip
    flush()
    bursts = []
    with tempfile.TemporaryDirectory(prefix="zoomies-bench-q2r-") as tmp:
        for size in args.bursts:
            burst = run_burst(args, size, Path(tmp))
            bursts.append(burst)
            print(f"  burst {size}: {burst.done} of {size} completed in {burst.total:.1f} s "
                  f"(load average before: {burst.load_before})")  # fmt: skip
            flush()

    print()
    print("Seconds from queued, per job:")
    print(table(["burst", "queued ->", "n", "p50 s", "p95 s", "max s"],
                [row for b in bursts for row in b.rows()]))  # fmt: skip
    print()
    print(table(
        ["burst", "first JIT s", "first create s", "agent creates/s", "burst total s",
         "completed", "warm-up job queued->in_progress s", "failed deliveries"],
        [[b.size, b.first_mint, b.first_create, b.creates_per_second, b.total,
          f"{b.done}/{b.size}", b.warmup, b.failed_deliveries] for b in bursts],
    ))  # fmt: skip
    print()
    print(
        "During each burst: busy CPUs of the whole machine (of "
        f"{os.cpu_count()}), CPU seconds of the controller's processes and of this one"
    )
    print("(the fake GitHub), the fake's own API handler time, and the machine's TCP listen")
    print("queue overflows (system-wide; each is a connect retried a second later):")
    print(table(
        ["burst", "machine busy CPUs", "web s", "workers s", "controller+agent s",
         "bench+fake s", "fake API calls", "fake API busy s", "fake API % of burst",
         "listen overflows"],
        [[b.size, b.machine_busy, b.controller_cpu.get("web", 0.0),
          b.controller_cpu.get("workers", 0.0), b.controller_cpu.get("controller", 0.0),
          b.bench_cpu, b.fake_calls, b.fake_busy,
          100 * b.fake_busy / b.total if b.total == b.total and b.total else float("nan"),
          b.overflows] for b in bursts],
    ))  # fmt: skip
    print(f"load average after: {load_average()}")
    return 0 if all(b.done == b.size for b in bursts) else 1


if __name__ == "__main__":
    sys.exit(main())
