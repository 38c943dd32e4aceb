"""Every benchmark, one table: `python -m bench [--quick]` (or `make bench`).

Runs, in order, each in a child process of its own except the first (so each cleans up
what it started): the scheduler on synthetic fleets (bench/scheduler.py), webhook ingest
(bench/webhook_ingest.py), queued to running on the process backend, single jobs and
bursts (bench/queued_to_running.py), the same single jobs on a private Docker engine
beside a bare `docker run` (bench/queued_to_running.py --backend docker), agents at scale
(bench/agents.py), live updates to SSE viewers (bench/live_updates.py) and the
controller's idle memory (bench/memory.py). Each step's own output goes to
bench/results/<step>.txt; this prints one table of every figure beside its floor or peer
measured in the same run and the ratio of the two, with the load average when it was
taken, and writes the figures (and each step's wall time) to bench/results/latest.json.

Sized for under 15 minutes on 2 cores (most of it the agents, one controller per N, each
held past a whole heartbeat interval, then the single jobs, one after another); `--quick`
is a smoke run of a few minutes with small sizes, for checking the harness, not for
figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import scheduler  # noqa: E402
from bench._common import load_average, machine, table  # noqa: E402

RESULTS = ROOT / "bench" / "results"


@dataclass
class Figure:
    step: str
    figure: str
    value: float | None
    unit: str
    reference: str  # the floor or peer, measured in the same run ("" when there is none)
    reference_value: float | None
    target: str
    load: str  # load average (1, 5, 15 min) when it was taken

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference_value:
            return None
        return self.value / self.reference_value


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _clean(value: object) -> object:
    """JSON without NaN: a figure that was not measured is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class Run:
    def __init__(self, quick: bool, out: Path) -> None:
        self.quick = quick
        self.out = out
        self.figures: list[Figure] = []
        self.details: dict[str, object] = {}
        self.failures: list[str] = []
        # The load average to record beside the next figures, when the step measured them
        # earlier than now (a child's run); "" means now.
        self.load = ""

    def add(self, step: str, figure: str, value: object, unit: str, reference: str = "",
            reference_value: object = None, target: str = "") -> None:  # fmt: skip
        self.figures.append(
            Figure(
                step,
                figure,
                _number(value),
                unit,
                reference,
                _number(reference_value),
                target,
                self.load or load_average(),
            )  # fmt: skip
        )

    def child(self, step: str, argv: list[str], timeout: float) -> object:
        """Run one benchmark script; its output to results/<step>.txt, its figures back."""
        figures_path = self.out / f"{step}.json"
        figures_path.unlink(missing_ok=True)
        with (self.out / f"{step}.txt").open("w") as log:
            child = subprocess.Popen(
                [sys.executable, *argv, "--json", str(figures_path)], cwd=ROOT,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                code: int | str = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                # SIGTERM first: each script unwinds on it and stops the controllers and
                # servers it started (they run in sessions of their own, so a SIGKILL here
                # would leave them behind).
                child.terminate()
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                code = f"timed out after {timeout:.0f} s"
        if code != 0:
            self.failures.append(f"{step}: exit {code} (see bench/results/{step}.txt)")
        if not figures_path.exists():
            return None
        figures = json.loads(figures_path.read_text())
        figures_path.unlink()
        self.details[step] = figures
        return figures


def step_scheduler(run: Run) -> None:
    from tests.runners.scheduler.reference import decide_reference  # noqa: PLC0415  # only this step needs the reference

    sizes = scheduler.QUICK_SIZES if run.quick else scheduler.SIZES
    timings = scheduler.run(sizes, scheduler.LAYOUTS, repeat=3)
    run.details["scheduler"] = [asdict(t) for t in timings]
    targets = {(100, 20, 1_000): "< 10 ms", (1_000, 200, 10_000): "< 100 ms"}
    for t in timings:
        size = f"{t.hosts}/{t.pools}/{t.jobs}"
        reference, reference_ms = "", None
        if (t.hosts, t.pools, t.jobs) == sizes[0]:
            # The peer: the same decision by plain scans (the code before the indexes).
            snap = scheduler.make_snapshot(t.hosts, t.pools, t.jobs, t.layout)
            cpu = time.thread_time()
            decide_reference(snap)
            reference, reference_ms = "scans (before)", (time.thread_time() - cpu) * 1000
        run.add("scheduler", f"decide() {size} {t.layout}, CPU", t.seconds * 1000, "ms",
                reference, reference_ms, targets.get((t.hosts, t.pools, t.jobs), ""))  # fmt: skip
    for layout in scheduler.LAYOUTS:
        mine = [t for t in timings if t.layout == layout]
        for before, after in zip(mine, mine[1:], strict=False):
            grown = after.jobs / before.jobs
            run.add("scheduler", f"decide() growth {before.jobs}->{after.jobs} jobs {layout}",
                    after.seconds / before.seconds, "x", "size ratio (linear)", grown,
                    "<= 12x per 10x")  # fmt: skip


def step_ingest(run: Run) -> None:
    # 16 connections for 30 s (10 s quick), as the wrk runs, at most N deliveries.
    deliveries, seconds = ("300", "10") if run.quick else ("15000", "30")
    figures = run.child(
        "webhook_ingest",
        ["bench/webhook_ingest.py", "--concurrency", "16", "--deliveries", deliveries,
         "--seconds", seconds],
        timeout=900,
    )  # fmt: skip
    if not isinstance(figures, dict):
        return
    for level in figures["levels"]:
        c = level["concurrency"]
        cpu = level["cpu_ms_per_delivery"]
        for floor, name in (("floor", "bare ASGI"), ("django", "Django hello-world")):
            run.add("ingest", f"webhook deliveries/s, {c} connections", level["zoomies_rate"],
                    "/s", f"{name} floor", level[f"{floor}_rate"], ">= 1000/s")  # fmt: skip
        run.add("ingest", f"webhook p50, {c} connections", level["zoomies_p50_ms"], "ms",
                "Django hello-world floor", level["django_p50_ms"])  # fmt: skip
        run.add("ingest", f"webhook p99, {c} connections", level["zoomies_p99_ms"], "ms",
                "Django hello-world floor", level["django_p99_ms"])  # fmt: skip
        run.add("ingest", "CPU per delivery, web + workers", cpu["web"] + cpu["workers"], "ms")
    run.add("ingest", "deliveries recorded exactly once", figures["recorded"], "",
            "deliveries sent", figures["sent"], "all")  # fmt: skip
    if run.quick:
        return
    # The scale-out shape (4 web processes, PostgreSQL, Redis), the same load in the same run.
    shaped = run.child(
        "webhook_ingest-scale-out",
        ["bench/webhook_ingest.py", "--concurrency", "16", "--deliveries", deliveries,
         "--seconds", seconds, "--web", "4"],
        timeout=900,
    )  # fmt: skip
    if isinstance(shaped, dict):
        for level in shaped["levels"]:
            c = level["concurrency"]
            run.add("ingest", f"webhook deliveries/s, {c} connections, 4 web + PostgreSQL",
                    level["zoomies_rate"], "/s", "single process, SQLite",
                    figures["levels"][0]["zoomies_rate"])  # fmt: skip
            run.add("ingest", f"webhook p99, {c} connections, 4 web + PostgreSQL",
                    level["zoomies_p99_ms"], "ms")  # fmt: skip
        run.add("ingest", "deliveries recorded exactly once, 4 web + PostgreSQL",
                shaped["recorded"], "", "deliveries sent", shaped["sent"], "all")  # fmt: skip


GARM_ROUNDS = 3
GARM_SECONDS, GARM_CONNECTIONS = 20, 16
# One more round each at this many connections: Zoomies' group commit is bound by how many
# deliveries are in flight at 16 (each waits for a burst), GARM's by its CPU.
GARM_MORE_CONNECTIONS = 64


def _garm_round(run: Run, side: str, round_no: int, conns: int = GARM_CONNECTIONS) -> dict | None:
    """One 20 s round of the same wrk load against GARM or Zoomies (bench/garm/README.md)."""
    work = run.out / "garm-rounds" / f"{side}-c{conns}-r{round_no}"
    shutil.rmtree(work, ignore_errors=True)
    if side == "garm":
        argv = ["bench/garm/bench.py", "--phases", "ingest", "--ingest-reps", "1",
                "--ingest-c1-reps", "0", "--invalid-reps", "0", "--duration", str(GARM_SECONDS),
                "--ingest-conns", str(conns), "--workdir", str(work)]  # fmt: skip
    else:
        argv = ["bench/garm/zoomies_ingest.py", "--project", str(ROOT), "--workdir", str(work),
                "--duration", str(GARM_SECONDS), "--conns", str(conns)]  # fmt: skip
        if side == "floor":
            argv.append("--floor")
    with (run.out / f"garm-{side}-c{conns}-r{round_no}.txt").open("w") as log:
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=log, text=True, timeout=600, check=False)  # fmt: skip
        log.write(done.stdout)
    if done.returncode != 0:
        run.failures.append(f"garm ingest: {side} round {round_no} exit {done.returncode}")
        return None
    if side == "garm":
        results = json.loads((work / "results.json").read_text())
        one = results["ingest"]["valid"]["runs"][0]
        return {"rps": one["rps"], "p50": one["lat_ms"]["p50"], "p99": one["lat_ms"]["p99"],
                "cpu_ms": one["garm_cpu_ms_per_req"], "ok": one["status_counts"].get("200", 0),
                "sent": one["requests"], "wrapped": one.get("wrapped", 0)}  # fmt: skip
    line = json.loads(done.stdout.strip().splitlines()[-1])
    wrk = line["wrk"]
    return {"rps": wrk["rps"], "p50": wrk["lat_ms"]["p50"], "p99": wrk["lat_ms"]["p99"],
            "cpu_ms": line["cpu_ms_per_job"], "ok": line["jobs_recorded"],
            "sent": wrk["status_counts"].get("200", 0),
            "wrapped": wrk.get("wrapped", 0)}  # fmt: skip


# GARM's harness posts a burst's deliveries on this many connections; the queued step sends
# Zoomies' with as many threads, so the burst rows compare like with like.
BURST_SENDERS = 8


def _garm_bursts(run: Run) -> dict[int, float]:
    """GARM's burst phase (bench/garm/bench.py: the jobs POSTed at once, to its last
    CreateInstance at its provider), once for each of the queued step's burst sizes: the
    same-run peer of that step's "last create handed out". GARM's provider is a script
    that returns at once, so no runner starts beside it; Zoomies' bursts start theirs."""
    last: dict[int, float] = {}
    for n in BURSTS:
        work = run.out / "garm-bursts" / str(n)
        shutil.rmtree(work, ignore_errors=True)
        argv = ["bench/garm/bench.py", "--phases", "burst", "--bursts", str(n), "--burst-reps",
                "1", "--burst-conns", str(BURST_SENDERS), "--workdir", str(work)]  # fmt: skip
        with (run.out / f"garm-burst-{n}.txt").open("w") as log:
            done = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=900, check=False)  # fmt: skip
        if done.returncode != 0:
            run.failures.append(f"garm burst {n}: exit {done.returncode}")
            continue
        found = json.loads((work / "results.json").read_text())["burst"][str(n)]["runs"][0]
        if found.get("last_s") is None:
            run.failures.append(f"garm burst {n}: {found.get('creates_seen')} of {n} creates")
            continue
        last[n] = found["last_s"]
    return last


def step_garm(run: Run) -> None:
    """Webhook ingest beside GARM, the closest peer, in alternating rounds of the same wrk
    script and payload (the issue's comparison): only when GARM_BIN names a built GARM."""
    garm = os.environ.get("GARM_BIN")
    if not garm or not Path(garm).is_file() or not shutil.which("wrk"):
        why = "GARM_BIN not set" if not garm else "GARM_BIN is not a file"
        why = why if shutil.which("wrk") or not garm else "no wrk"
        run.add("garm", f"not measured: {why} (bench/garm/README.md builds GARM)", None, "")
        return
    rounds: dict[str, list[dict]] = {"garm": [], "zoomies": [], "floor": []}
    for round_no in range(1 if run.quick else GARM_ROUNDS):
        for side in ("garm", "zoomies", "floor"):
            figures = _garm_round(run, side, round_no)
            if figures is not None:
                rounds[side].append(figures)
    run.details["garm"] = rounds
    if not rounds["garm"] or not rounds["zoomies"]:
        return

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[side])

    n = len(rounds["zoomies"])
    run.add("garm", f"webhook deliveries/s, 16 connections, median of {n} rounds",
            median("zoomies", "rps"), "/s", "GARM, same rounds", median("garm", "rps"),
            ">= 2x GARM")  # fmt: skip
    run.add("garm", "webhook p50", median("zoomies", "p50"), "ms", "GARM", median("garm", "p50"))
    run.add("garm", "webhook p99", median("zoomies", "p99"), "ms", "GARM", median("garm", "p99"))
    run.add("garm", "CPU per delivery, whole process tree", median("zoomies", "cpu_ms"), "ms",
            "GARM", median("garm", "cpu_ms"), "<= 1 ms")  # fmt: skip
    if rounds["floor"]:
        # The web server alone (a bare ASGI app under daphne, as the controller serves it):
        # what any route of ours costs before Django, the check or the database.
        run.add("garm", "webhook deliveries/s (as above)", median("zoomies", "rps"), "/s",
                "bare ASGI under daphne, same rounds", median("floor", "rps"))  # fmt: skip
        run.add("garm", "CPU per delivery (as above)", median("zoomies", "cpu_ms"), "ms",
                "bare ASGI under daphne", median("floor", "cpu_ms"))  # fmt: skip
    run.add("garm", "Zoomies: jobs recorded, all rounds", sum(r["ok"] for r in rounds["zoomies"]),
            "", "deliveries answered 200", sum(r["sent"] for r in rounds["zoomies"]),
            "all")  # fmt: skip
    more = (
        {}
        if run.quick
        else {
            side: _garm_round(run, side, 0, GARM_MORE_CONNECTIONS) for side in ("garm", "zoomies")
        }
    )
    run.details["garm_more_connections"] = more
    if more.get("garm") and more.get("zoomies"):
        c = GARM_MORE_CONNECTIONS
        run.add("garm", f"webhook deliveries/s, {c} connections, one round each",
                more["zoomies"]["rps"], "/s", "GARM, same run", more["garm"]["rps"],
                ">= 2x GARM")  # fmt: skip
        run.add("garm", f"webhook p99, {c} connections", more["zoomies"]["p99"], "ms", "GARM",
                more["garm"]["p99"])  # fmt: skip
        run.add("garm", f"CPU per delivery, {c} connections", more["zoomies"]["cpu_ms"], "ms",
                "GARM", more["garm"]["cpu_ms"], "<= 1 ms")  # fmt: skip
    if not run.quick:
        run.details["garm_burst"] = _garm_bursts(run)
    # A body file that ran out sends redeliveries, which cost less than new jobs: a round
    # with any is not a fair one, so it is counted here rather than hidden.
    sides = [*(r for name in ("garm", "zoomies") for r in rounds[name]),
             *(r for r in more.values() if r)]  # fmt: skip
    run.add("garm", "requests that repeated a delivery (body file wrapped), both sides",
            sum(r["wrapped"] for r in sides), "", "", None, "0")  # fmt: skip


# Sizes of the queued-to-running steps (issue 12 item 5). The single jobs run one after
# another, so their count is most of the step's time; Docker's are fewer for that reason.
SINGLES, BURSTS = 100, (100, 500)
DOCKER_SINGLES, DOCKER_FLOOR_RUNS = 30, 30
BURST_TARGETS = {100: "< 2 s (the target at 200)", 200: "< 2 s", 500: "< 5 s"}
# Stages of a single job, as bench/queued_to_running.py names them, and the targets.
SINGLE_STAGES = {
    "handed": ("create handed to the agent", {"p50": "< 0.05 s", "p99": "< 0.25 s"}),
    "started": ("runner started", {}),
    "registered": ("runner registered at the fake GitHub", {}),
}


def _singles(run: Run, step: str, singles: object, started: str, floors: dict) -> None:
    """The p50 and p99 of each stage of the single jobs; `floors` maps a stage to the
    (name, {p50, p99}) of its floor measured in the same run."""
    if not isinstance(singles, dict):
        return
    run.load = singles["load_before"]
    n = singles["count"]
    for stage, (name, targets) in SINGLE_STAGES.items():
        if stage == "started":
            name = started
        floor, floor_values = floors.get(stage, ("", {}))
        for p in ("p50", "p99"):
            run.add(step, f"{n} single jobs: queued -> {name}, {p}", singles[f"{stage}_{p}_s"],
                    "s", floor, floor_values.get(p), targets.get(p, ""))  # fmt: skip


def step_queued(run: Run) -> None:
    if run.quick:
        argv = ["--singles", "10", "--bursts", "20"]
    else:
        argv = ["--singles", str(SINGLES), "--bursts", *map(str, BURSTS), "--timeout", "300",
                "--senders", str(BURST_SENDERS)]  # fmt: skip
    figures = run.child("queued_to_running", ["bench/queued_to_running.py", *argv], timeout=900)
    if not isinstance(figures, dict):
        return
    _singles(run, "queued", figures["singles"], "runner process started", {})
    for burst in figures["bursts"]:
        n = burst["size"]
        run.load = burst["load_before"]
        garm = run.details.get("garm_burst", {}).get(n)
        run.add("queued", f"burst of {n}: last create handed out", burst["last_handed_s"], "s",
                "GARM, same run: last CreateInstance (no runner starts)" if garm else "", garm,
                BURST_TARGETS.get(n, ""))  # fmt: skip
        run.add("queued", f"burst of {n}: last job running", burst["last_running_s"], "s")
        run.add("queued", f"burst of {n}: webhook answered p99", burst["delivered_p99_s"], "s")
        run.add("queued", f"burst of {n}: all completed", burst["total_s"], "s")
    if run.quick:
        return
    # The same bursts with runners that take no job and cost no CPU: the controller's own
    # path to the last create, beside no runner's work, as GARM's harness times its bursts.
    idle = run.child(
        "queued_to_running-idle-runners",
        ["bench/queued_to_running.py", "--singles", "0", "--bursts", *map(str, BURSTS),
         "--timeout", "300", "--idle-runners", "--senders", str(BURST_SENDERS)],
        timeout=900,
    )  # fmt: skip
    if isinstance(idle, dict):
        for burst in idle["bursts"]:
            n = burst["size"]
            run.load = burst["load_before"]
            garm = run.details.get("garm_burst", {}).get(n)
            run.add("queued", f"burst of {n}, idle runners: last create handed out",
                    burst["last_handed_s"], "s",
                    "GARM, same run: last CreateInstance (no runner starts)" if garm else "",
                    garm, BURST_TARGETS.get(n, ""))  # fmt: skip
            run.add("queued", f"burst of {n}, idle runners: webhook answered p99",
                    burst["delivered_p99_s"], "s")  # fmt: skip
    # The same bursts on the scale-out shape (4 web processes, PostgreSQL, Redis, an agent
    # process of its own), in the same run.
    shaped = run.child(
        "queued_to_running-scale-out",
        ["bench/queued_to_running.py", "--singles", "0", "--bursts", *map(str, BURSTS),
         "--timeout", "300", "--web", "4", "--senders", str(BURST_SENDERS)],
        timeout=900,
    )  # fmt: skip
    if isinstance(shaped, dict):
        single = {b["size"]: b["last_handed_s"] for b in figures["bursts"]}
        for burst in shaped["bursts"]:
            n = burst["size"]
            run.add("queued", f"burst of {n}, 4 web + PostgreSQL: last create handed out",
                    burst["last_handed_s"], "s", "single process", single.get(n),
                    BURST_TARGETS.get(n, ""))  # fmt: skip


def step_docker(run: Run) -> None:
    singles, floor_runs = ("5", "5") if run.quick else (str(DOCKER_SINGLES), str(DOCKER_FLOOR_RUNS))
    figures = run.child(
        "queued_docker",
        ["bench/queued_to_running.py", "--backend", "docker", "--singles", singles, "--bursts",
         "--floor-runs", floor_runs],
        timeout=600,
    )  # fmt: skip
    if not isinstance(figures, dict):
        return
    engine = figures.get("engine") or {}
    if not engine.get("available"):
        # Said in the table, not left out: a missing row would read as never asked for.
        run.add("docker", f"not measured: no Docker engine ({engine.get('reason', '?')})",
                None, "")  # fmt: skip
        return
    floor = figures.get("floor") or {}
    started = {"p50": floor.get("started_p50_s"), "p99": floor.get("started_p99_s")}
    whole = {"p50": floor.get("whole_p50_s"), "p99": floor.get("whole_p99_s")}
    _singles(run, "docker", figures["singles"], "runner container started", {
        "started": ("bare docker run -> container started", started),
        "registered": ("bare docker run of `python3 -c pass`, to its exit", whole),
    })  # fmt: skip


def step_agents(run: Run) -> None:
    if run.quick:
        runs = {"agents": ["--agents", "20", "--ramp", "2", "--hold", "5", "--interval", "2"]}
    else:
        # The larger fleets also on the scale-out shape (4 web processes, PostgreSQL and
        # Redis) beside the single process, in the same child, one after the other.
        runs = {"agents": ["--agents", "100", "500"],
                "agents-scale-out": ["--agents", "1000", "2000", "--web", "4"]}  # fmt: skip
    for step, argv in runs.items():
        figures = run.child(step, ["-m", "bench.agents", *argv, "--logs", str(run.out)],
                            timeout=1500)  # fmt: skip
        if isinstance(figures, list):
            for r in figures:
                _agent_rows(run, r)


def _agent_rows(run: Run, r: dict) -> None:
    shape = r.get("shape", "single process")
    n = f"{r['agents']} agents" + ("" if shape == "single process" else f" ({shape})")
    run.load = r["load"]
    run.add("agents", f"{n}: joins that succeeded", r["joined"], "", "agents", r["agents"],
            "all")  # fmt: skip
    run.add("agents", f"{n}: join p99", r["join_p99_ms"], "ms",
            "/healthz p99", r["healthz_p99_ms"])  # fmt: skip
    run.add("agents", f"{n}: heartbeat p50", r["heartbeat_p50_ms"], "ms",
            "/healthz p50", r["healthz_p50_ms"])  # fmt: skip
    run.add("agents", f"{n}: heartbeat p99", r["heartbeat_p99_ms"], "ms",
            "/healthz p99", r["healthz_p99_ms"], "< 250 ms")  # fmt: skip
    if "held_heartbeat_p99_ms" in r:  # results written before it was measured lack it
        run.add("agents", f"{n}: heartbeat p99 after the joins (the hold)",
                r["held_heartbeat_p99_ms"], "ms", "/healthz p99", r["healthz_p99_ms"],
                "< 250 ms")  # fmt: skip
    run.add("agents", f"{n}: long-polls held open", r["polls_open"], "", "agents", r["agents"],
            "all")  # fmt: skip
    run.add("agents", f"{n}: server CPU", r["controller_cpu_cores"], "cores")
    run.add("agents", f"{n}: PSS of the process tree", r["pss_mb"], "MB",
            "", None, "<= 200 MB at 1000")  # fmt: skip
    run.add("agents", f"{n}: RSS of the process tree", r["rss_mb"], "MB")
    run.add("agents", f"{n}: server still running at the end",
            int(r["controller_alive"]), "yes=1", "", None, "1")  # fmt: skip


def step_live(run: Run) -> None:
    viewers, changes = ("20", "5") if run.quick else ("200", "12")
    figures = run.child(
        "live_updates",
        ["-m", "bench.live_updates", "--viewers", viewers, "--changes", changes],
        timeout=300,
    )
    if not isinstance(figures, list):
        return
    by_target = {r["target"]: r for r in figures}
    mine, floor = by_target.get("zoomies"), by_target.get("floor") or {}
    if mine is None:
        return
    run.load = mine["load"]
    n = mine["viewers"]
    for who in ("first", "last"):
        for p in ("p50", "p99"):
            run.add("live", f"{n} SSE viewers: change -> {who} viewer's frame, {p}",
                    mine[f"{who}_{p}_ms"], "ms", "bare ASGI SSE floor",
                    floor.get(f"{who}_{p}_ms"))  # fmt: skip
    run.add("live", f"{n} SSE viewers: changes that reached every viewer", mine["reached_all"],
            "", "changes made", mine["changes"], "all")  # fmt: skip


def step_memory(run: Run) -> None:
    argv = ["-m", "bench.memory", "--settle", "3" if run.quick else "20"]
    figures = run.child("memory", argv, timeout=300)
    if not isinstance(figures, dict):
        return
    run.add("memory", "idle controller: PSS of the process tree", figures["pss_mb"], "MB",
            "Django hello-world floor", figures["floor_django_pss_mb"], "<= 150 MB")  # fmt: skip
    run.add("memory", "idle controller: RSS of the process tree", figures["rss_mb"], "MB")
    by_role: dict[str, list[float]] = {}
    for process in figures["processes"]:
        by_role.setdefault(process["role"], []).append(process["pss_mb"])
    for role, values in sorted(by_role.items()):
        run.add("memory", f"idle controller: PSS of {role} ({len(values)} processes)",
                sum(values), "MB")  # fmt: skip


STEPS: dict[str, Callable[[Run], None]] = {
    "scheduler": step_scheduler,
    "ingest": step_ingest,
    "garm": step_garm,
    "queued": step_queued,
    "docker": step_docker,
    "agents": step_agents,
    "live": step_live,
    "memory": step_memory,
}


def report(run: Run) -> str:
    rows = []
    for f in run.figures:
        rows.append([
            f.step, f.figure, "-" if f.value is None else f.value, f.unit,
            f.reference or "-", "-" if f.reference_value is None else f.reference_value,
            "-" if f.ratio is None else f"{f.ratio:.2f}", f.target or "-", f.load.split()[0],
        ])  # fmt: skip
    return table(
        [
            "step",
            "figure",
            "value",
            "unit",
            "floor / peer (same run)",
            "its value",
            "ratio",
            "target",
            "load 1m",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--only", nargs="+", choices=list(STEPS), help="run only these steps")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("ZOOMIES_DATABASE_URL", None)  # SQLite: the README's default

    run = Run(args.quick, args.out)
    began = time.monotonic()
    about = machine()
    print(f"machine: {about}", flush=True)
    step_seconds: dict[str, float] = {}
    for name, step in STEPS.items():
        if args.only and name not in args.only:
            continue
        started = time.monotonic()
        run.load = ""
        try:
            step(run)
        except Exception as exc:  # one broken step must not lose the others' figures
            run.failures.append(f"{name}: {exc!r}")
        step_seconds[name] = time.monotonic() - started
        print(f"  {name}: {step_seconds[name]:.0f} s (load {load_average()})", flush=True)
    elapsed = time.monotonic() - began

    print()
    print(report(run))
    print(f"\n{len(run.figures)} figures in {elapsed / 60:.1f} min; load average after: "
          f"{load_average()}")  # fmt: skip
    for failure in run.failures:
        print(f"FAILED {failure}")
    latest = args.out / "latest.json"
    latest.write_text(
        json.dumps(
            _clean(
                {
                    "machine": about,
                    "nproc": len(os.sched_getaffinity(0)),
                    "quick": run.quick,
                    "minutes": elapsed / 60,
                    "step_seconds": step_seconds,
                    "failures": run.failures,
                    "figures": [{**asdict(f), "ratio": f.ratio} for f in run.figures],
                    "details": run.details,
                }
            ),  # fmt: skip
            indent=1,
        )
        + "\n"
    )
    print(f"written: {latest.relative_to(ROOT) if latest.is_relative_to(ROOT) else latest}")
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
