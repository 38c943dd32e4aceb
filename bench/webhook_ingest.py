"""Webhook ingest: how many signed `workflow_job` deliveries a real controller takes a second.

A real controller (`manage.py controller --no-agent`, through tests/e2e/harness.Controller,
over its own temp data dir and SQLite, or PostgreSQL with --postgres) gets N deliveries
(action `queued`, each with its own X-GitHub-Delivery and job id, built from GitHub's
example in tests/fixtures/github/webhooks/workflow_job.queued.json and signed as GitHub
signs) from C concurrent httpx clients, one keep-alive connection each. The FLOOR is the
same load in the same run against bench/floor_asgi.py, a bare ASGI app that reads the body
and answers 200, served by daphne like the controller: the ratio is what Zoomies costs
over the server and this client. Afterwards the controller's API must list every delivery's
job exactly once (`recorded: N of N`).

Where the time goes: the CPU seconds of the controller's processes (daphne, the django-q2
cluster that runs the reconcile passes each delivery wakes, the controller itself) and of
this process, per delivery, counted until the controller is quiet again after each load.

    .venv/bin/python bench/webhook_ingest.py [--deliveries 500] [--concurrency 1 4 16]
                                             [--postgres] [--web N]

`--web N` loads the scale-out shape instead (bench/scale_out.py: N web processes on one
port and one workers process, PostgreSQL and Redis); "web" then counts all N.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench._common import (  # noqa: E402
    CLOCK_TICK,
    CpuSampler,
    cpu_jiffies,
    drop_postgres,
    flush,
    kill_session,
    load_average,
    machine,
    own_cpu,
    pct,
    postgres_sessions,
    sigterm_raises,
    stop_controller,
    table,
)
from bench.scale_out import ScaleOut  # noqa: E402
from runners.github.fake import FakeGitHub  # noqa: E402
from tests.e2e.harness import Controller, free_port, wait_for  # noqa: E402

FIXTURE = ROOT / "tests/fixtures/github/webhooks/workflow_job.queued.json"
SECRET = "bench-secret"
ACCOUNT = "acme"
REPO = "acme/app"
POSTGRES_URL = "postgres://root@127.0.0.1:5432/test"
WARMUP = 20
JOB_ID_BASE = 7_000_000_000


def sign(body: bytes, secret: str) -> str:
    """GitHub's X-Hub-Signature-256, as runners.webhooks.sign computes it.

    Not imported from there: that module needs Django loaded. Every 200 the controller
    answers (it answers 401 to a bad signature) shows the two agree.
    """
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Deliveries:
    """Signed `queued` deliveries with fresh delivery and job ids, built before any clock runs."""

    def __init__(self, installation_id: int):
        template = json.loads(FIXTURE.read_text())
        template["installation"]["id"] = installation_id
        repo = template["repository"]
        repo["full_name"], repo["name"] = REPO, REPO.split("/")[1]
        repo["owner"]["login"] = ACCOUNT
        template["workflow_job"]["labels"] = ["self-hosted", "bench"]
        self.template = template
        self.next_job = JOB_ID_BASE
        self.sent_job_ids: list[int] = []

    def make(self, count: int) -> list[tuple[dict[str, str], bytes]]:
        made = []
        for _ in range(count):
            payload = copy.deepcopy(self.template)
            self.next_job += 1
            job = payload["workflow_job"]
            job["id"] = self.next_job
            job["run_id"] = self.next_job + 1_000_000_000
            job["created_at"] = job["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ")
            body = json.dumps(payload, separators=(",", ":")).encode()
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "GitHub-Hookshot/bench",
                "X-GitHub-Event": "workflow_job",
                "X-GitHub-Delivery": str(uuid.uuid4()),
                "X-Hub-Signature-256": sign(body, SECRET),
            }
            made.append((headers, body))
            self.sent_job_ids.append(self.next_job)
        return made


@dataclass
class Result:
    target: str
    concurrency: int
    deliveries: int
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.deliveries / self.wall if self.wall else float("nan")

    def row(self) -> list[object]:
        ms = [x * 1000 for x in self.latencies]
        return [
            self.target, self.concurrency, self.deliveries, self.wall, self.rate,
            pct(ms, 50), pct(ms, 95), pct(ms, 99), self.errors,
        ]  # fmt: skip


def load(
    target: str,
    url: str,
    items: list[tuple[dict[str, str], bytes]],
    concurrency: int,
    seconds: float | None = None,
):
    """Closed loop: `concurrency` threads, one httpx client each, take the next item in turn.

    With `seconds`, no item is taken after that many seconds: `result.deliveries` says how
    many were sent (the first ones of `items`).
    """
    result = Result(target, concurrency, len(items))
    lock = threading.Lock()
    position = iter(range(len(items)))
    start = threading.Barrier(concurrency + 1)
    handed = [0]
    deadline = [float("inf")]

    def worker() -> None:
        latencies, errors, first_error = [], 0, ""
        with httpx.Client(timeout=30) as client:
            try:  # open the connection before the clock starts
                client.get(url.rsplit("/", 2)[0] + "/healthz")
            except httpx.HTTPError:
                pass  # the first delivery will say what is wrong
            start.wait()
            while True:
                with lock:
                    index = next(position, None)
                    if index is not None and time.perf_counter() > deadline[0]:
                        index = None
                    if index is not None:
                        handed[0] += 1
                if index is None:
                    break
                headers, body = items[index]
                began = time.perf_counter()
                try:
                    response = client.post(url, content=body, headers=headers)
                    ok = response.status_code == 200 and b"duplicate" not in response.content
                    error = "" if ok else f"{response.status_code} {response.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, error = False, repr(exc)
                latencies.append(time.perf_counter() - began)
                if not ok:
                    errors += 1
                    first_error = first_error or error
        with lock:
            result.latencies.extend(latencies)
            result.errors += errors
            result.first_error = result.first_error or first_error

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    if seconds is not None:
        deadline[0] = time.perf_counter() + seconds
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    result.wall = time.perf_counter() - began
    result.deliveries = handed[0]
    return result


class Floor:
    """daphne serving a floor app (bench/floor_asgi.py or bench/floor_django.py), as the
    controller serves Zoomies."""

    def __init__(self, log_path: Path, app: str = "bench.floor_asgi:application"):
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/webhooks/github"
        self.log = log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
             "--access-log", os.devnull, app],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.sampler = CpuSampler(self.process.pid)

    def wait_ready(self) -> None:
        wait_for(self._ready, 30, f"the floor daphne on port {self.port}", every=0.1)

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the floor {self.app} exited with {self.process.returncode}")
        return httpx.post(self.url, content=b"{}", timeout=2).status_code == 200

    def cpu(self) -> float:
        return self.sampler.total()

    def stop(self) -> None:
        self.sampler.stop()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        kill_session(self.process.pid)
        self.log.close()


def idle_rates(cpu: CpuSampler, seconds: float = 3.0) -> dict[str, float]:
    """CPU seconds a second each role burns doing nothing (ticker, queue polling), by role."""
    before = cpu.by_role()
    time.sleep(seconds)
    after = cpu.by_role()
    return {role: (after[role] - before.get(role, 0.0)) / seconds for role in after}


def settle(cpu: CpuSampler, idle: float, limit: float = 30.0) -> float:
    """Wait until the controller is back to its idle CPU rate; seconds waited."""
    began = time.monotonic()
    quiet = 0
    last = cpu.total()
    while time.monotonic() - began < limit and quiet < 2:
        time.sleep(0.25)
        now = cpu.total()
        quiet = quiet + 1 if (now - last) / 0.25 <= idle + 0.05 else 0
        last = now
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=500, help="per concurrency level")
    parser.add_argument(
        "--seconds", type=float, help="send for at most this long per level (and target)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--postgres", action="store_true", help=f"use {POSTGRES_URL}")
    parser.add_argument("--postgres-url", default=POSTGRES_URL, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--web",
        type=int,
        default=0,
        help="the scale-out shape: this many web processes, PostgreSQL, Redis",
    )
    args = parser.parse_args()
    if args.web:
        args.postgres = True
    sigterm_raises()
    if args.postgres:
        os.environ["ZOOMIES_DATABASE_URL"] = args.postgres_url
    else:
        os.environ.pop("ZOOMIES_DATABASE_URL", None)

    print(f"machine: {machine()}")
    print(f"database: {'PostgreSQL' if args.postgres else 'SQLite (WAL)'}")
    if args.web:
        print(f"shape: {args.web} web processes + 1 workers, Redis")
    flush()
    with tempfile.TemporaryDirectory(prefix="zoomies-bench-ingest-") as tmp:
        return run(args, Path(tmp))


def run(args, tmp: Path) -> int:
    # A fake GitHub as the App's API, so nothing the controller does leaves this machine; it
    # sends nothing itself (the deliveries come from the load generator).
    fake = FakeGitHub(webhook_url=None, webhook_secret=SECRET).start()
    (tmp / "app.pem").write_text(fake.private_key_pem)
    installation_id = fake.add_installation(account=ACCOUNT, repositories=[REPO])
    # A unique name: with PostgreSQL the harness names (and first drops) a database after it.
    data_dir = Path(tempfile.mkdtemp(prefix="ingest-", dir=tmp))
    github = {
        "ZOOMIES_GITHUB_API_URL": fake.url,
        "ZOOMIES_GITHUB_APP_ID": str(fake.app_id),
        "ZOOMIES_GITHUB_PRIVATE_KEY_FILE": str(tmp / "app.pem"),
        "ZOOMIES_GITHUB_WEBHOOK_SECRETS": SECRET,
    }
    controller = (
        ScaleOut(data_dir, args.web, env=github) if args.web else Controller(data_dir, env=github)
    )
    floor = django_floor = cpu = None
    try:
        controller.prepare()
        controller.manage(
            "add_installation", "--id", str(installation_id), "--account", ACCOUNT,
            "--repo", REPO,
        )  # fmt: skip
        controller.start("--no-agent")
        cpu = CpuSampler(controller.process.pid)
        floor = Floor(tmp / "floor.log")
        django_floor = Floor(tmp / "floor-django.log", "bench.floor_django:application")
        floor.wait_ready()
        django_floor.wait_ready()
        hook = f"{controller.url}/webhooks/github"
        deliveries = Deliveries(installation_id)
        warm = deliveries.make(WARMUP)
        targets = (("zoomies", hook), ("floor", floor.url), ("django", django_floor.url))
        for target, url in targets:
            result = load(target, url, warm, 1)
            if result.errors:
                raise RuntimeError(f"warm-up against {target}: {result.first_error}")
        settle(cpu, 0.05, limit=10)
        idle_by_role = idle_rates(cpu)
        idle = sum(idle_by_role.values())
        print(f"controller idle: {idle * 1000:.0f} ms CPU a second (subtracted below)")
        flush()

        results: list[Result] = []
        cpu_rows = []
        sessions_rows = []
        for concurrency in args.concurrency:
            items = deliveries.make(args.deliveries)
            cpu_before, own_before, jiffies_before = cpu.by_role(), own_cpu(), cpu_jiffies()
            sessions_before = postgres_sessions(controller)
            began = time.monotonic()
            zoomies = load("zoomies", hook, items, concurrency, args.seconds)
            # Only what was sent is owed to the job list, and the floors get the same.
            unsent = len(items) - zoomies.deliveries
            if unsent:
                del deliveries.sent_job_ids[-unsent:]
                items = items[: zoomies.deliveries]
            own_load = own_cpu() - own_before
            drain = settle(cpu, idle)
            cpu_after = cpu.by_role()
            machine_busy = (cpu_jiffies()[0] - jiffies_before[0]) / CLOCK_TICK
            if sessions_before is not None:
                # pg_stat_database is updated as sessions end: give the last ones a moment.
                time.sleep(1.0)
                opened = postgres_sessions(controller) - sessions_before
                sessions_rows.append([concurrency, opened / len(items)])
            spent = time.monotonic() - began
            per = {
                role: max(
                    cpu_after.get(role, 0.0)
                    - cpu_before.get(role, 0.0)
                    - idle_by_role.get(role, 0.0) * spent,
                    0.0,
                )
                * 1000
                / len(items)
                for role in ("web", "workers", "controller")
            }
            floor_cpu_before, floor_own_before = floor.cpu(), own_cpu()
            floor_result = load("floor", floor.url, items, concurrency)
            floor_cpu = (floor.cpu() - floor_cpu_before) * 1000 / len(items)
            floor_own = (own_cpu() - floor_own_before) * 1000 / len(items)
            django_cpu_before = django_floor.cpu()
            django_result = load("django", django_floor.url, items, concurrency)
            django_cpu = (django_floor.cpu() - django_cpu_before) * 1000 / len(items)
            results += [zoomies, floor_result, django_result]
            own_per = own_load * 1000 / len(items)
            machine_per = machine_busy * 1000 / len(items)
            cpu_rows.append([concurrency, per["web"], per["workers"], per["controller"],
                             own_per, machine_per, drain, floor_cpu, floor_own,
                             django_cpu])  # fmt: skip
            print(
                f"  c={concurrency}: zoomies {zoomies.rate:.0f}/s, floor "
                f"{floor_result.rate:.0f}/s, django {django_result.rate:.0f}/s; controller "
                f"quiet again {drain:.1f} s after"
            )
            for r in (zoomies, floor_result, django_result):
                if r.errors:
                    print(f"    {r.target} errors: {r.errors}, first: {r.first_error}")
            flush()

        print()
        print(table(
            ["target", "concurrency", "deliveries", "wall s", "deliveries/s", "p50 ms",
             "p95 ms", "p99 ms", "errors"],
            [r.row() for r in results],
        ))  # fmt: skip
        print()
        triples = [results[i : i + 3] for i in range(0, len(results), 3)]
        print(table(
            ["concurrency", "throughput zoomies/floor", "p50 zoomies/floor",
             "throughput zoomies/django", "zoomies ms/delivery (1/rate)"],
            [[z.concurrency, z.rate / f.rate, pct(z.latencies, 50) / pct(f.latencies, 50),
              z.rate / d.rate, 1000 / z.rate] for z, f, d in triples],
        ))  # fmt: skip
        print()
        print("CPU ms per delivery (controller's idle rate subtracted; workers counted until")
        print("the controller is quiet again; 'client' is this process: httpx + the fake):")
        print(table(
            ["concurrency", "web (daphne+Django)", "workers (django-q2)", "controller",
             "client", "whole machine", "quiet after s", "floor server", "floor client",
             "django floor server"],
            cpu_rows,
        ))  # fmt: skip
        print()

        if sessions_rows:
            print("PostgreSQL connections opened per delivery (pg_stat_database.sessions, all of")
            print("the controller's processes, until it is quiet again):")
            print(table(["concurrency", "connections/delivery"], sessions_rows))
            print()

        listed = controller.api("jobs", params={"status": "queued"})
        counts = Counter(job["github_id"] for job in listed)
        sent = deliveries.sent_job_ids
        recorded = sum(1 for job_id in sent if counts.get(job_id) == 1)
        twice = sum(1 for job_id in sent if counts.get(job_id, 0) > 1)
        print(f"recorded: {recorded} of {len(sent)} (listed more than once: {twice}; "
              f"queued jobs listed in all: {len(listed)})")  # fmt: skip
        print(f"load average after: {load_average()}")
        ok = recorded == len(sent) and twice == 0 and not any(r.errors for r in results)
        if args.json:
            args.json.write_text(json.dumps({
                "database": "postgresql" if args.postgres else "sqlite",
                "web_processes": args.web or 1,
                "recorded": recorded, "sent": len(sent), "ok": ok,
                "levels": [
                    {
                        "concurrency": z.concurrency, "deliveries": z.deliveries,
                        **{f"{r.target}_{key}": value for r in (z, f, d) for key, value in (
                            ("rate", r.rate), ("p50_ms", pct(r.latencies, 50) * 1000),
                            ("p99_ms", pct(r.latencies, 99) * 1000), ("errors", r.errors))},
                        "cpu_ms_per_delivery": dict(zip(
                            ("web", "workers", "controller", "client", "machine"),
                            row[1:6], strict=True)),
                    }
                    for (z, f, d), row in zip(triples, cpu_rows, strict=True)
                ],
                "load_after": load_average(),
            }, indent=1))  # fmt: skip
        return 0 if ok else 1
    except BaseException:
        print(f"controller log (tail):\n{controller.log()}", file=sys.stderr)
        raise
    finally:
        if cpu is not None:
            cpu.stop()
        for server in (floor, django_floor):
            if server is not None:
                server.stop()
        stop_controller(controller)
        fake.stop()
        if args.web:
            controller.drop_database()
        else:
            drop_postgres(controller)


if __name__ == "__main__":
    sys.exit(main())
