"""Queued to running: how fast the fleet starts runners for queued jobs, one at a time and
in bursts, on the process backend or on Docker.

For comparison, GARM (cloudbase/garm) took 5.8 s from a queued webhook to its first create
and 11.6 s for a burst of 200 in a harness of ours. Here a real controller (`manage.py
controller`, through tests/e2e/harness.Controller) serves a fake GitHub in this process, as
tests/e2e/conftest.py's `e2e` fixture wires them: the fake sends signed deliveries to the
controller, the controller mints JIT configurations at the fake and hands a create task to
the agent, the agent starts one runner per job, the runner registers at the fake and takes
its job. The agent is the controller's embedded one with the process backend, or with
`--backend docker` a `python -m fleet.agent --backend docker` process on a private dockerd
(bench/engine.py: the backend tests' engine and locally built runner image).

Each controller (a fresh one and database per burst; the single jobs run on the first
burst's, before its burst) runs one warm-up job first, so what is timed meets a controller
that holds its installation token, as a long-running one does. Then:

* `--singles N`: N jobs queued one at a time, each only after the one before has run;
* `--bursts B ...`: B jobs queued at once.

With `--idle-runners` the bursts' runners run a program that starts, takes no job and costs
no CPU (each runner is still the process backend's supervisor, a Python process): what is
timed is the controller's own path to the last create handed out, beside no runner's work,
as GARM's harness times its bursts to its last CreateInstance at a provider that starts
nothing. The warm-up job runs on the fake runner first.

Per job, from the moment it was queued:

* delivered: the controller answered the job's `queued` delivery (the fake sends its
  deliveries one at a time, so in a burst each waits for those before it; --senders N
  sends with N threads);
* JIT minted: the fake minted a JIT configuration;
* create handed out: the agent's long poll took the create task (its `taken_at`, stamped by
  fleet/taskqueue.take_tasks just before the poll answers, read from the database);
* runner started: the process backend's meta.json `started_at`, or the engine's `start`
  event of the runner's container;
* registered: the runner opened its session at the fake;
* in progress: the fake gave the job to a runner; completed: the runner finished it.

In a burst the k-th mint, create, start and session after the burst began are paired with
the k-th queued job (an ephemeral runner is not bound to a job; the fake hands each to the
oldest queued job it can take). A single job's are simply the first after it was queued.

The fake's hooks are timed by subclassing it (its ISO timestamps have whole seconds), and
its own API handler time is reported, to show the fake is not the bottleneck. Every runner
process is a Python process (plus its supervisor shim), so a burst costs real CPU: the CPU
use of the machine during each burst is printed. With Docker, the floor is measured in the
same run: `docker run` of the same image on the same engine and network
(`--floor-runs`), to its container's start and to its end.

    .venv/bin/python bench/queued_to_running.py [--singles 20] [--bursts 1 10 50]
                                                [--backend process|docker] [--floor-runs 20]
                                                [--duration 1.0] [--senders 1]
                                                [--fake-backlog 128] [--no-warmup] [--postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
    kill_session,
    listen_overflows,
    load_average,
    machine,
    own_cpu,
    pct,
    sigterm_raises,
    stop_controller,
    table,
)
from bench.engine import ContainerStarts, bare_runs, engine_or_reason  # noqa: E402
from bench.marks import Handouts, ProcessWatch, TimedFake  # noqa: E402
from bench.scale_out import ScaleOut  # noqa: E402
from runners.github.fake import core as fake_core  # noqa: E402
from tests.e2e.harness import Controller, wait_for  # noqa: E402

SECRET = "bench-secret"
ACCOUNT = "acme"
REPO = "acme/app"
LABELS = ["self-hosted", "bench"]
POSTGRES_URL = "postgres://root@127.0.0.1:5432/test"
FAKE_RUNNER_IMAGE = "zoomies/fake-runner"  # runners.github.programs.FAKE_RUNNER
RUNNER_CONTAINER_PREFIX = "zoomies-runner-"  # fleet.agent.backends.container.NAME_PREFIX
# The runner containers share the host's network, so the fake runner in them reaches the
# fake GitHub on 127.0.0.1 (the private dockerd has no bridge); the floor runs on it too.
RUNNER_NETWORK = "host"
JOIN_TOKEN = (
    "from datetime import timedelta\n"
    "from django.utils import timezone\n"
    "from fleet.actions import create_join_token\n"
    "print(create_join_token(now=timezone.now(), actor='bench', ttl=timedelta(hours=1))[1])\n"
)


# `--idle-runners`: the process program GitHub's runner is started as (runners.github.programs
# ACTIONS_RUNNER), here a run.sh that starts, takes no job and costs no CPU, so the burst's
# runners do not share the two cores with the controller, as GARM's harness starts nothing.
IDLE_IMAGE = "actions-runner"


def idle_runner_dir(data_dir: Path) -> Path:
    """A run.sh that waits and never registers; its command line names the data directory, so
    the rig's kill_leftovers ends it with the rest."""
    folder = data_dir / "idle-runner"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "run.sh"
    script.write_text(f"#!/bin/sh\nexec tail -f {script}\n")
    script.chmod(0o755)
    return folder


@dataclass
class Rig:
    """One controller with its fake GitHub, its agent and the marks the benchmark reads."""

    fake: TimedFake
    controller: Controller
    handouts: Handouts
    backend: str
    process_watch: ProcessWatch | None = None
    container_starts: ContainerStarts | None = None
    warmup: float = float("nan")

    def runner_starts(self, t0: float) -> list[float]:
        if self.container_starts is not None:
            return self.container_starts.since(t0, RUNNER_CONTAINER_PREFIX)
        return self.process_watch.since(t0) if self.process_watch is not None else []


@contextlib.contextmanager
def rig(args, tmp: Path, capacity: int, engine=None) -> Iterator[Rig]:
    """A fresh controller, database and agent of `capacity` slots, warmed up; taken down
    with everything it started when the block ends."""
    fake = TimedFake(webhook_url=None, webhook_secret=SECRET).start()
    fake.add_senders(args.senders - 1)
    key = tmp / "app.pem"
    key.write_text(fake.private_key_pem)
    # A unique name: with PostgreSQL the harness names (and first drops) a database after it.
    data_dir = Path(tempfile.mkdtemp(prefix=f"q2r{capacity}-", dir=tmp))
    github = {
        "ZOOMIES_GITHUB_API_URL": fake.url,
        "ZOOMIES_GITHUB_APP_ID": str(fake.app_id),
        "ZOOMIES_GITHUB_PRIVATE_KEY_FILE": str(key),
        "ZOOMIES_GITHUB_WEBHOOK_SECRETS": SECRET,
    }
    if args.idle_runners:
        github["ZOOMIES_ACTIONS_RUNNER_DIR"] = str(idle_runner_dir(data_dir))
    controller = (
        ScaleOut(data_dir, args.web, env=github) if args.web else Controller(data_dir, env=github)
    )
    fake.webhook_url = f"{controller.url}/webhooks/github"
    agent: subprocess.Popen | None = None
    agent_log = None
    watch = starts = None
    try:
        installation = fake.add_installation(account=ACCOUNT, repositories=[REPO])
        controller.prepare()
        controller.manage(
            "add_installation", "--id", str(installation), "--account", ACCOUNT, "--repo", REPO
        )
        if engine is None and args.web:
            # The scale-out shape has no embedded agent: one of its own, where ProcessWatch
            # looks (<data dir>/agent), dialling the web tier.
            watch = ProcessWatch(data_dir)
            token = controller.manage("shell", "-c", JOIN_TOKEN).splitlines()[-1]
            controller.start()
            agent_log = (data_dir / "process-agent.log").open("w")
            agent = subprocess.Popen(
                [sys.executable, "-m", "fleet.agent", "--controller", controller.url,
                 "--state-dir", str(data_dir / "agent"), "--name", "bench-process",
                 "--capacity", str(capacity), "--backend", "process"],
                cwd=ROOT, env={**os.environ, "ZOOMIES_JOIN_TOKEN": token},
                stdout=agent_log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            backend, image = "process", FAKE_RUNNER_IMAGE
        elif engine is None:
            watch = ProcessWatch(data_dir)
            controller.start("--agent-capacity", str(capacity))
            backend, image = "process", FAKE_RUNNER_IMAGE
        else:
            starts = ContainerStarts(engine.url)
            token = controller.manage("shell", "-c", JOIN_TOKEN).splitlines()[-1]
            controller.start("--no-agent")
            agent_log = (data_dir / "docker-agent.log").open("w")
            agent = subprocess.Popen(
                [sys.executable, "-m", "fleet.agent", "--controller", controller.url,
                 "--state-dir", str(data_dir / "docker-agent"), "--name", "bench-docker",
                 "--capacity", str(capacity), "--backend", "docker", "--docker-url",
                 engine.url, "--pull-policy", "never", "--runner-network", RUNNER_NETWORK],
                cwd=ROOT, env={**os.environ, "ZOOMIES_JOIN_TOKEN": token},
                stdout=agent_log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            backend, image = "docker", engine.image
        controller.api("pools", method="POST", json={
            "name": "zoomies-bench", "labels": ["bench"], "backend": backend,
            "image": image, "max_runners": capacity,
        })  # fmt: skip
        wait_for(lambda: controller.api("hosts"), 60, "the agent to join")
        made = Rig(fake, controller, Handouts(controller), backend, watch, starts)
        if args.warmup:
            began = time.time()
            job = fake.queue_job(repo=REPO, labels=LABELS, duration=0.1)
            wait_for(lambda: job in fake.completed, 120, "the warm-up job", every=0.05)
            made.warmup = fake.started[job] - began
        if args.idle_runners:
            # The warm-up ran on the fake runner; the burst's runners run the idle program.
            wait_quiet(made)
            (pool,) = controller.api("pools")
            controller.api(f"pools/{pool['id']}", method="PATCH", json={"image": IDLE_IMAGE})
            wait_quiet(made)
        yield made
    except BaseException:
        print(f"controller log (tail):\n{controller.log()}", file=sys.stderr)
        if agent_log is not None:
            print(f"docker agent log (tail):\n{_tail(agent_log.name)}", file=sys.stderr)
        raise
    finally:
        if agent is not None:
            _stop_process(agent)
            agent_log.close()
        for watcher in (watch, starts):
            if watcher is not None:
                watcher.stop()
        stop_controller(controller)
        fake.stop()
        kill_leftovers(str(data_dir))
        if args.web:
            controller.drop_database()
        else:
            drop_postgres(controller)


def wait_quiet(made: Rig) -> None:
    """Every runner ended (its removed row stays for the retention with its output,
    LOG-06: wait for its end, not its reap), then a second for the passes it woke."""
    wait_for(
        lambda: all(r["state"] == "removed" for r in made.controller.api("runners")),
        60,
        "the runners' end",
    )
    time.sleep(1.0)


def _stop_process(process: subprocess.Popen) -> None:
    """SIGTERM a process this benchmark started in a session of its own, then whatever of
    that session is left."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    kill_session(process.pid)


def _tail(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")[-4000:]
    except OSError:
        return ""


# -- single jobs ---------------------------------------------------------------------------------

SINGLE_STAGES = ("delivered", "minted", "handed", "started", "registered", "in_progress")
STAGE_NAMES = {
    "delivered": "delivered",
    "minted": "JIT minted",
    "handed": "create handed to the agent",
    "started": "runner started",
    "registered": "registered at the fake GitHub",
    "in_progress": "in progress",
    "created": "runner started (k-th)",
    "online": "registered (k-th)",
    "completed": "completed",
}


@dataclass
class Singles:
    count: int
    backend: str
    stages: dict[str, list[float]] = field(default_factory=dict)
    load_before: str = ""
    seconds: float = float("nan")  # the whole series, wall

    def rows(self) -> list[list[object]]:
        return [
            [self.backend, STAGE_NAMES[name], len(values), pct(values, 50), pct(values, 99),
             max(values) if values else float("nan")]
            for name, values in self.stages.items()
        ]  # fmt: skip

    def figures(self) -> dict[str, object]:
        figures: dict[str, object] = {
            "count": self.count, "backend": self.backend, "load_before": self.load_before,
            "seconds": self.seconds,
        }  # fmt: skip
        for name, values in self.stages.items():
            figures[f"{name}_n"] = len(values)
            figures[f"{name}_p50_s"] = pct(values, 50)
            figures[f"{name}_p99_s"] = pct(values, 99)
        return figures


def run_singles(made: Rig, args) -> Singles:
    """`--singles` jobs, each queued once the one before has run to its end, so each meets
    an idle fleet (the last runner's removal may still be under way, as in real life)."""
    count, duration, timeout = args.singles, args.single_duration, args.timeout
    singles = Singles(count, made.backend, {name: [] for name in SINGLE_STAGES})
    singles.load_before = load_average()
    fake = made.fake
    series_began = time.monotonic()
    for k in range(count):
        t = time.time()
        job = fake.queue_job(repo=REPO, labels=LABELS, duration=duration)
        wait_for(lambda job=job: job in fake.completed, timeout, f"single job {k + 1}",
                 every=0.01)  # fmt: skip
        firsts = {
            "minted": fake.after(fake.mints, t),
            "handed": made.handouts.since(t),
            "started": made.runner_starts(t),
            "registered": fake.after(fake.sessions, t),
        }
        delivered = fake.delivered.get(job)
        if delivered is not None:
            singles.stages["delivered"].append(delivered[0] - t)
        for name, marks in firsts.items():
            if marks:
                singles.stages[name].append(marks[0] - t)
        singles.stages["in_progress"].append(fake.started[job] - t)
    singles.seconds = time.monotonic() - series_began
    print(f"  {count} single jobs on {made.backend} in {singles.seconds:.1f} s "
          f"(load average before: {singles.load_before})")  # fmt: skip
    flush()
    wait_quiet(made)
    return singles


# -- bursts --------------------------------------------------------------------------------------


@dataclass
class Burst:
    size: int
    backend: str = "process"
    queued: dict[int, float] = field(default_factory=dict)
    delivered: list[float] = field(default_factory=list)
    minted: list[float] = field(default_factory=list)
    handed: list[float] = field(default_factory=list)
    created: list[float] = field(default_factory=list)
    online: list[float] = field(default_factory=list)
    in_progress: list[float] = field(default_factory=list)
    completed: list[float] = field(default_factory=list)
    first_create: float = float("nan")
    creates_per_second: float = float("nan")
    first_mint: float = float("nan")
    last_handed: float = float("nan")  # from the first job queued
    last_running: float = float("nan")  # from the first job queued
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

    def stages(self) -> dict[str, list[float]]:
        return {
            "delivered": self.delivered, "minted": self.minted, "handed": self.handed,
            "created": self.created, "online": self.online, "in_progress": self.in_progress,
            "completed": self.completed,
        }  # fmt: skip

    def rows(self) -> list[list[object]]:
        return [
            [self.size, STAGE_NAMES[name] + (" (k-th)" if name in ("minted", "handed") else ""),
             len(values), pct(values, 50), pct(values, 95),
             max(values) if values else float("nan")]
            for name, values in self.stages().items()
        ]  # fmt: skip


def paired(marks: list[float], queued_at: list[float]) -> list[float]:
    """The k-th mark after the burst began minus the k-th queue time."""
    marks = sorted(m for m in marks if m >= queued_at[0])
    return [m - q for m, q in zip(marks, queued_at, strict=False)]


def run_burst(made: Rig, size: int, args) -> Burst:
    burst = Burst(size, made.backend, warmup=made.warmup)
    fake, controller = made.fake, made.controller
    fake.reset_marks()
    burst.load_before = load_average()
    cpu = CpuSampler(controller.process.pid)
    try:
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
            if args.idle_runners:
                # No job ever runs: the burst ends with its last create handed out.
                if len(made.handouts.since(queued_at[0])) >= size:
                    break
                time.sleep(0.1)
                continue
            if all(j in fake.completed for j in burst.queued):
                break
            time.sleep(0.02)
        ended = time.time()

        burst.overflows = listen_overflows() - overflows_before
        busy1, total1 = cpu_jiffies()
        burst.machine_busy = (busy1 - busy0) / max(total1 - total0, 1) * os.cpu_count()
        cpu_after = cpu.by_role()
    finally:
        cpu.stop()
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
    handed = made.handouts.since(t0)
    created = made.runner_starts(t0)
    burst.minted = paired(fake.mints, queued_at)
    burst.handed = paired(handed, queued_at)
    burst.created = paired(created, queued_at)
    burst.online = paired(fake.sessions, queued_at)
    burst.first_mint = burst.minted[0] if burst.minted else float("nan")
    burst.first_create = burst.created[0] if burst.created else float("nan")
    if len(handed) >= size:
        burst.last_handed = handed[size - 1] - t0
    running = [fake.started[j] for j in burst.queued if j in fake.started]
    if len(running) == size:
        burst.last_running = max(running) - t0
    if len(created) > 1 and created[-1] > created[0]:
        burst.creates_per_second = (len(created) - 1) / (created[-1] - created[0])
    burst.total = (max(fake.completed.get(j, ended) for j in burst.queued)) - t0
    return burst


def burst_figures(burst: Burst) -> dict[str, object]:
    """One burst's figures for the harness (bench/__main__.py): seconds from queued."""
    figures: dict[str, object] = {
        "size": burst.size, "backend": burst.backend, "done": burst.done,
        "total_s": burst.total, "first_mint_s": burst.first_mint,
        "first_create_s": burst.first_create, "last_handed_s": burst.last_handed,
        "last_running_s": burst.last_running, "creates_per_second": burst.creates_per_second,
        "warmup_s": burst.warmup, "failed_deliveries": burst.failed_deliveries,
        "load_before": burst.load_before,
    }  # fmt: skip
    for name, values in burst.stages().items():
        figures[f"{name}_p50_s"] = pct(values, 50)
        figures[f"{name}_p99_s"] = pct(values, 99)
        figures[f"{name}_max_s"] = max(values) if values else float("nan")
    return figures


# -- the run -------------------------------------------------------------------------------------


def run(args, tmp: Path) -> dict[str, object]:
    """Every measurement asked for; the figures for --json."""
    figures: dict[str, object] = {"backend": args.backend, "singles": None, "bursts": []}
    docker = args.backend == "docker"
    with engine_or_reason(tmp) if docker else contextlib.nullcontext((None, "")) as found:
        engine, missing = found
        if docker:
            figures["engine"] = {"available": engine is not None, "reason": missing,
                                 "image": getattr(engine, "image", "")}  # fmt: skip
            if engine is None:
                print(f"no Docker engine: {missing}")
                return figures
            print(f"engine: private dockerd at {engine.url}, image {engine.image}")
            flush()
        sizes = list(args.bursts)
        singles = None
        if args.singles and not sizes:
            with rig(args, tmp, args.capacity, engine) as made:
                singles = run_singles(made, args)
        for i, size in enumerate(sizes):
            with rig(args, tmp, max(size, args.capacity), engine) as made:
                if i == 0 and args.singles:
                    singles = run_singles(made, args)
                burst = run_burst(made, size, args)
            figures["bursts"].append(burst)
            print(f"  burst {size}: {burst.done} of {size} completed in {burst.total:.1f} s "
                  f"(load average before: {burst.load_before})")  # fmt: skip
            flush()
        figures["singles"] = singles
        if engine is not None and args.floor_runs:
            starts = ContainerStarts(engine.url)
            try:
                floor_load = load_average()
                floor = bare_runs(engine, starts, args.floor_runs, RUNNER_NETWORK)
            finally:
                starts.stop()
            figures["floor"] = {
                "runs": args.floor_runs, "load_before": floor_load,
                "started_p50_s": pct(floor.started, 50), "started_p99_s": pct(floor.started, 99),
                "whole_p50_s": pct(floor.whole, 50), "whole_p99_s": pct(floor.whole, 99),
            }  # fmt: skip
    return figures


def report(figures: dict[str, object]) -> None:
    singles: Singles | None = figures["singles"]  # type: ignore[assignment]
    bursts: list[Burst] = figures["bursts"]  # type: ignore[assignment]
    if singles is not None:
        print()
        print(f"{singles.count} single jobs, each queued after the one before ran; seconds from "
              "queued:")  # fmt: skip
        print(table(["backend", "queued ->", "n", "p50 s", "p99 s", "max s"], singles.rows()))
    floor = figures.get("floor")
    if isinstance(floor, dict):
        print()
        print(f"Floor, same engine and run: `docker run --network {RUNNER_NETWORK} IMAGE "
              f"python3 -c pass`, {floor['runs']} times, seconds from the command:")  # fmt: skip
        print(table(["to", "p50 s", "p99 s"], [
            ["container started", floor["started_p50_s"], floor["started_p99_s"]],
            ["command returned (exited)", floor["whole_p50_s"], floor["whole_p99_s"]],
        ]))  # fmt: skip
    if not bursts:
        return
    print()
    print("Bursts, seconds from queued, per job:")
    print(table(["burst", "queued ->", "n", "p50 s", "p95 s", "max s"],
                [row for b in bursts for row in b.rows()]))  # fmt: skip
    print()
    print(table(
        ["burst", "first JIT s", "first create s", "last create handed out s",
         "last job running s", "agent creates/s", "burst total s", "completed",
         "warm-up job queued->in_progress s", "failed deliveries"],
        [[b.size, b.first_mint, b.first_create, b.last_handed, b.last_running,
          b.creates_per_second, b.total, f"{b.done}/{b.size}", b.warmup,
          b.failed_deliveries] for b in bursts],
    ))  # fmt: skip
    print("(last create handed out and last job running: from the first job queued)")
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--singles", type=int, default=20, help="jobs queued one at a time (0: none)")
    p.add_argument("--bursts", type=int, nargs="*", default=[1, 10, 50])
    p.add_argument("--backend", choices=["process", "docker"], default="process")
    p.add_argument(
        "--floor-runs", type=int, default=20, help="bare `docker run`s for the floor (Docker)"
    )
    p.add_argument("--capacity", type=int, default=4, help="agent slots when no burst sets them")
    p.add_argument("--duration", type=float, default=1.0, help="seconds each burst job runs")
    p.add_argument(
        "--single-duration", type=float, default=0.0, help="seconds each single job runs"
    )
    p.add_argument("--timeout", type=float, default=120.0, help="per burst or job, seconds")
    p.add_argument(
        "--senders", type=int, default=1, help="threads the fake sends deliveries with (its own: 1)"
    )
    p.add_argument(
        "--fake-backlog",
        type=int,
        default=128,
        help="the fake's listen backlog (socketserver's default, 5, drops "
        "connects in a burst; each costs a 1 s retransmit)",
    )
    p.add_argument(
        "--idle-runners",
        action="store_true",
        help="bursts' runners run a program that takes no job and costs no CPU (GARM's harness "
        "starts nothing); a burst ends with its last create handed out",
    )
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--postgres", action="store_true", help=f"use {POSTGRES_URL}")
    p.add_argument(
        "--web",
        type=int,
        default=0,
        help="the scale-out shape: this many web processes, PostgreSQL, Redis",
    )
    p.add_argument("--postgres-url", default=POSTGRES_URL, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # A socketserver's listen backlog is 5: in a burst (8 concurrent mints plus every
    # runner's connections) a full queue drops a connect, and the client's SYN is retried a
    # second later, which stalls a whole pass: the fake, not the controller, would be
    # measured. GitHub does not drop connects, so the fake gets a real backlog unless told.
    fake_core.Server.request_queue_size = args.fake_backlog
    sigterm_raises()
    if args.web:
        args.postgres = True  # the scale-out shape's own database (bench/scale_out.py)
    elif args.postgres:
        os.environ["ZOOMIES_DATABASE_URL"] = args.postgres_url
    else:
        os.environ.pop("ZOOMIES_DATABASE_URL", None)

    print(f"machine: {machine()}")
    database = "PostgreSQL" if args.postgres else "SQLite (WAL)"
    if args.web:
        database += f", {args.web} web processes + 1 workers, Redis"
    print(f"database: {database}; backend: {args.backend}; burst job duration {args.duration} "
          f"s, single job {args.single_duration} s; warm-up job first: "
          f"{'yes' if args.warmup else 'no'}; delivery threads: {args.senders}; "
          f"fake listen backlog: {args.fake_backlog}")  # fmt: skip
    flush()
    with tempfile.TemporaryDirectory(prefix="zoomies-bench-q2r-") as tmp:
        figures = run(args, Path(tmp))
    report(figures)
    print(f"load average after: {load_average()}")
    singles: Singles | None = figures["singles"]  # type: ignore[assignment]
    bursts: list[Burst] = figures["bursts"]  # type: ignore[assignment]
    if args.json:
        out = {
            **figures,
            "singles": singles.figures() if singles is not None else None,
            "bursts": [burst_figures(b) for b in bursts],
        }
        args.json.write_text(json.dumps(out, indent=1))
    # With idle runners no job runs: a burst is complete once every create was handed out.
    complete = all((len(b.handed) if args.idle_runners else b.done) == b.size for b in bursts) and (
        singles is None or len(singles.stages["in_progress"]) == singles.count
    )
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
