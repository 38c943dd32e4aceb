"""A smoke test of `python -m bench`: it runs, prints one table and writes latest.json.

Only the harness is checked (a step runs, every figure has a value, a floor's ratio is
the quotient of the two, each step turns its script's figures into the rows it names, the
SSE floor fans a frame out); no speed is asserted here, that is what the benchmarks are for.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import subprocess
import sys
from pathlib import Path

from bench import floor_sse
from bench.__main__ import (
    STEPS,
    Figure,
    Run,
    _clean,
    report,
    step_docker,
    step_garm,
    step_live,
    step_queued,
)
from bench.marks import _epoch
from tests.fleet.backends import conftest as backend_engines

ROOT = Path(__file__).resolve().parents[2]


def test_bench_quick_scheduler_step_prints_one_table_and_writes_latest_json(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "scheduler", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("floor / peer (same run)") == 1  # one table
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert latest["quick"] is True and latest["failures"] == []
    figures = latest["figures"]
    names = [f["figure"] for f in figures]
    for layout in ("uniform", "partitioned"):
        assert f"decide() 100/20/1000 {layout}, CPU" in names
        assert f"decide() growth 1000->10000 jobs {layout}" in names
    assert all(f["value"] is not None and f["value"] > 0 for f in figures)
    peers = [f for f in figures if f["reference"]]
    assert peers
    for f in peers:
        assert f["ratio"] == f["value"] / f["reference_value"]
    assert len(latest["details"]["scheduler"]) == 4


def test_a_figure_without_a_floor_has_no_ratio_and_nan_is_written_as_null() -> None:
    assert Figure("s", "f", 3.0, "ms", "", None, "", "1 1 1").ratio is None
    assert Figure("s", "f", 3.0, "ms", "floor", 2.0, "", "1 1 1").ratio == 1.5
    assert _clean({"a": [float("nan"), 1.0], "b": float("inf")}) == {"a": [None, 1.0], "b": None}


def _run_with(tmp_path: Path, figures: object) -> Run:
    """A harness run whose child steps answer `figures` instead of running a script."""
    run = Run(quick=True, out=tmp_path)
    run.child = lambda step, argv, timeout: figures  # type: ignore[method-assign]
    return run


def _stages(seconds: float) -> dict[str, float]:
    """A single-job series' figures as bench/queued_to_running.py writes them."""
    return {f"{s}_{p}_s": seconds for s in ("handed", "started", "registered")
            for p in ("p50", "p99")}  # fmt: skip


def test_the_steps_run_in_order_with_docker_after_queued_and_live_before_memory() -> None:
    assert list(STEPS) == [
        "scheduler", "ingest", "garm", "queued", "docker", "agents", "live", "memory"
    ]  # fmt: skip


def test_single_jobs_give_a_p50_and_p99_row_per_stage_with_the_issue_targets(
    tmp_path: Path,
) -> None:
    stages = _stages(0.5)
    singles = {"count": 10, "load_before": "1.0 1.0 1.0", **stages}
    burst = {"size": 20, "load_before": "1.0 1.0 1.0", "last_handed_s": 0.3,
             "last_running_s": 1.5, "delivered_p99_s": 0.1, "total_s": 2.5}  # fmt: skip
    run = _run_with(tmp_path, {"singles": singles, "bursts": [burst]})
    step_queued(run)
    rows = {f.figure: f for f in run.figures}
    handed = rows["10 single jobs: queued -> create handed to the agent, p50"]
    assert (handed.value, handed.target) == (0.5, "< 0.05 s")
    assert rows["10 single jobs: queued -> create handed to the agent, p99"].target == "< 0.25 s"
    assert "10 single jobs: queued -> runner process started, p99" in rows
    assert "10 single jobs: queued -> runner registered at the fake GitHub, p50" in rows
    assert rows["burst of 20: last create handed out"].value == 0.3
    assert rows["burst of 20: last job running"].value == 1.5


def test_docker_single_jobs_stand_beside_the_bare_docker_run_of_the_same_run(
    tmp_path: Path,
) -> None:
    stages = _stages(0.4)
    floor = {"started_p50_s": 0.1, "started_p99_s": 0.2, "whole_p50_s": 0.2, "whole_p99_s": 0.4}
    run = _run_with(tmp_path, {
        "engine": {"available": True, "reason": "", "image": "zoomies-test/runner:x"},
        "singles": {"count": 5, "load_before": "1.0 1.0 1.0", **stages}, "bursts": [],
        "floor": floor,
    })  # fmt: skip
    step_docker(run)
    rows = {f.figure: f for f in run.figures}
    started = rows["5 single jobs: queued -> runner container started, p99"]
    assert started.reference == "bare docker run -> container started"
    assert started.ratio == 0.4 / 0.2
    registered = rows["5 single jobs: queued -> runner registered at the fake GitHub, p50"]
    assert registered.reference_value == 0.2 and registered.ratio == 2.0
    assert rows["5 single jobs: queued -> create handed to the agent, p50"].reference == ""


def test_without_a_docker_engine_the_table_says_so_instead_of_a_figure(tmp_path: Path) -> None:
    run = _run_with(tmp_path, {
        "engine": {"available": False, "reason": "dockerd is not installed", "image": ""},
        "singles": None, "bursts": [],
    })  # fmt: skip
    step_docker(run)
    (row,) = run.figures
    assert row.figure == "not measured: no Docker engine (dockerd is not installed)"
    assert row.value is None and row.ratio is None
    assert "not measured: no Docker engine" in report(run)


def test_live_updates_give_first_and_last_viewer_rows_beside_the_bare_sse_floor(
    tmp_path: Path,
) -> None:
    delays = {f"{w}_{p}_ms": v for w, v in (("first", 300.0), ("last", 400.0))
              for p in ("p50", "p99")}  # fmt: skip
    floor = {f"{w}_{p}_ms": v for w, v in (("first", 3.0), ("last", 4.0)) for p in ("p50", "p99")}
    run = _run_with(tmp_path, [
        {"target": "zoomies", "viewers": 20, "changes": 5, "reached_all": 5,
         "load": "1.0 1.0 1.0", **delays},
        {"target": "floor", **floor},
    ])  # fmt: skip
    step_live(run)
    rows = {f.figure: f for f in run.figures}
    last = rows["20 SSE viewers: change -> last viewer's frame, p99"]
    assert (last.value, last.reference, last.ratio) == (400.0, "bare ASGI SSE floor", 100.0)
    assert rows["20 SSE viewers: change -> first viewer's frame, p50"].ratio == 100.0
    reached = rows["20 SSE viewers: changes that reached every viewer"]
    assert (reached.value, reached.reference_value) == (5.0, 5.0)


def test_the_engine_is_the_backend_tests_own_fixtures_called_outside_pytest() -> None:
    # bench/engine.py calls these through inspect.unwrap: a plain function that builds the
    # image, and the engine's generator whose close() is the tear-down.
    assert inspect.isfunction(inspect.unwrap(backend_engines.runner_image_tar))
    assert inspect.isgeneratorfunction(inspect.unwrap(backend_engines.docker_engine))


def test_a_create_tasks_stored_time_is_read_as_utc_whether_naive_text_or_aware() -> None:
    aware = datetime.datetime(2026, 12, 1, 21, 50, 45, 123456, tzinfo=datetime.UTC)
    assert _epoch("2026-12-01 21:50:45.123456") == aware.timestamp()
    assert _epoch(aware) == aware.timestamp()


def test_the_sse_floor_sends_a_ready_frame_then_each_change_to_every_open_stream() -> None:
    async def scenario() -> list[list[bytes]]:
        streams = []
        for _ in range(2):
            inbox: asyncio.Queue[dict] = asyncio.Queue()
            sent: list[bytes] = []
            await inbox.put({"type": "http.request", "body": b"", "more_body": False})

            async def send(message: dict, sent: list[bytes] = sent) -> None:
                if message["type"] == "http.response.body":
                    sent.append(message["body"])

            scope = {"type": "http", "method": "GET", "query_string": b""}
            task = asyncio.ensure_future(floor_sse.application(scope, inbox.get, send))
            streams.append((inbox, sent, task))
        await asyncio.sleep(0.01)
        post: asyncio.Queue[dict] = asyncio.Queue()
        await post.put({"type": "http.request", "body": b"", "more_body": False})
        answered: list[dict] = []

        async def send_answer(message: dict) -> None:
            answered.append(message)

        scope = {"type": "http", "method": "POST", "query_string": b"paused=1"}
        await floor_sse.application(scope, post.get, send_answer)
        assert answered[0]["status"] == 200
        await asyncio.sleep(0.01)
        for inbox, _sent, task in streams:
            await inbox.put({"type": "http.disconnect"})
            await asyncio.wait_for(task, 5)
        assert not floor_sse.STREAMS  # a stream that went away is forgotten
        return [sent for _inbox, sent, _task in streams]

    for sent in asyncio.run(scenario()):
        assert sent[0] == floor_sse.READY
        assert sent[1:] == [b'event: pool\ndata: {"kind": "pool.changed", "object": '
                            b'{"paused": true}}\n\n']  # fmt: skip


def test_without_a_garm_binary_the_peer_rows_say_why_they_were_not_measured(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv("GARM_BIN", raising=False)
    run = Run(quick=True, out=tmp_path)
    step_garm(run)
    assert [f.figure for f in run.figures] == [
        "not measured: GARM_BIN not set (bench/garm/README.md builds GARM)"
    ]
    assert run.figures[0].value is None


def test_the_garm_rounds_give_medians_beside_the_peer_and_the_floor(
    tmp_path: Path, monkeypatch
) -> None:
    """Alternating rounds against GARM, Zoomies and the bare ASGI floor: each row is a
    side's median beside the other's, and wrapped bodies (redeliveries) are counted."""
    import bench.__main__ as harness  # noqa: PLC0415  # its round runner is replaced here

    garm = tmp_path / "garm"
    garm.write_text("")
    monkeypatch.setenv("GARM_BIN", str(garm))
    monkeypatch.setattr(harness.shutil, "which", lambda name: f"/usr/bin/{name}")
    rates = {"garm": [500.0, 600.0, 550.0], "zoomies": [700.0, 650.0, 900.0],
             "floor": [1200.0, 1100.0, 1300.0]}  # fmt: skip

    more = {"garm": 600.0, "zoomies": 1250.0}  # the one pair at GARM_MORE_CONNECTIONS

    def round_of(run, side, round_no, conns=harness.GARM_CONNECTIONS):
        rps = rates[side][round_no] if conns == harness.GARM_CONNECTIONS else more[side]
        return {"rps": rps, "p50": 20.0, "p99": 40.0, "cpu_ms": 2.0,
                "ok": 100, "sent": 100, "wrapped": 1 if side == "garm" else 0}  # fmt: skip

    monkeypatch.setattr(harness, "_garm_round", round_of)
    run = Run(quick=False, out=tmp_path)
    step_garm(run)
    rows = {f.figure: f for f in run.figures}
    rate = rows["webhook deliveries/s, 16 connections, median of 3 rounds"]
    assert (rate.value, rate.reference_value, rate.target) == (700.0, 550.0, ">= 2x GARM")
    assert rows["webhook deliveries/s (as above)"].reference_value == 1200.0
    assert rows["Zoomies: jobs recorded, all rounds"].value == 300
    more_rate = rows["webhook deliveries/s, 64 connections, one round each"]
    assert (more_rate.value, more_rate.reference_value) == (1250.0, 600.0)
    # Three GARM rounds at 16 connections and the one at 64 each sent one redelivery.
    assert rows["requests that repeated a delivery (body file wrapped), both sides"].value == 4
