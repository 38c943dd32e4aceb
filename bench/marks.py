"""What bench/queued_to_running.py reads to time each stage of a job, without slowing it.

* `TimedFake`: the fake GitHub, noting when it minted a JIT configuration, when a runner
  opened its session (registered), when a job started and finished and when the
  controller answered a job's `queued` delivery; its ISO timestamps have whole seconds.
* `ProcessWatch`: when the process backend started each runner (its meta.json).
* `Handouts`: when the agent's long poll took each create task (the task's `taken_at`).

Every mark is epoch seconds on this machine's clock (time.time(), the controller's
`timezone.now()`, the engine's event stamps), so they compare with each other.
"""

from __future__ import annotations

import datetime
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from runners.github.fake.server import FakeGitHub
from runners.github.fake.state import Observer
from tests.e2e.harness import Controller


class TimedFake(FakeGitHub, Observer):
    """The fake GitHub, noting (time.time()) when each thing the benchmark measures happens.

    It is its own state's observer: the fake tells it of each moment as it happens, some
    under its lock; nothing else changes.
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
        self.state.observer = self

    def jit_minted(self, runner):
        with self.marks_lock:
            self.mints.append(time.time())

    def session_opened(self, runner):
        with self.marks_lock:
            self.sessions.append(time.time())

    def job_started(self, job):
        self.started[job.id] = time.time()

    def job_finished(self, job):
        self.completed[job.id] = time.time()

    def delivery_recorded(self, item, status):
        if item.action == "queued":
            with self.marks_lock:
                self.delivered.setdefault(item.job_id, (time.time(), status))

    def _github(self, req):
        began = time.perf_counter()
        try:
            return super()._github(req)
        finally:
            with self.marks_lock:
                self.api_calls += 1
                self.api_seconds += time.perf_counter() - began

    def add_senders(self, count: int) -> None:
        """`count` more deliveries in flight at once beside the fake's one (GitHub does not
        send one at a time), each on a thread of its own, so a job's deliveries may then
        arrive out of order. More sender loops alone would not do it: the fake's outbox
        lets only `concurrency` deliveries be in flight, one by default."""
        if count > 0:
            self.set_delivery(concurrency=count + 1)

    def reset_marks(self) -> None:
        with self.marks_lock:
            self.mints.clear()
            self.sessions.clear()
            self.api_calls, self.api_seconds = 0, 0.0

    def after(self, marks: list[float], t0: float) -> list[float]:
        with self.marks_lock:
            return sorted(m for m in marks if m >= t0)


class ProcessWatch:
    """Notes each runner process the agent creates: meta.json's `started_at`, written by the
    process backend at create, read before the runner's directory is cleaned away.

    The embedded agent's process backend keeps runners in `<data dir>/agent/work/runners/`
    (zoomies_site/embedded_agent.py, fleet/agent/cli.py, fleet/agent/backends/process.py).
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


class Handouts:
    """When each create task was handed to the agent: the `taken_at` of the controller's
    create_runner tasks, read from its database (SQLite read-only, or PostgreSQL). The
    stamp is the controller's `timezone.now()` on this machine's clock, so it compares
    with time.time() here; reading it after the fact costs the controller nothing."""

    QUERY = (
        "SELECT taken_at FROM fleet_agenttask WHERE kind = 'create_runner' AND taken_at IS NOT NULL"
    )

    def __init__(self, controller: Controller) -> None:
        self.url = controller.env.get("ZOOMIES_DATABASE_URL")
        self.path = controller.env.get("ZOOMIES_DB", "")

    def since(self, t0: float) -> list[float]:
        if self.url:
            import psycopg  # noqa: PLC0415  # only a PostgreSQL run needs it

            with psycopg.connect(self.url, autocommit=True) as conn:
                rows = conn.execute(self.QUERY).fetchall()
        else:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
            try:
                rows = conn.execute(self.QUERY).fetchall()
            finally:
                conn.close()
        return sorted(t for t in (_epoch(row[0]) for row in rows) if t >= t0)


def _epoch(value: object) -> float:
    """A stored datetime as epoch seconds: Django keeps SQLite's as naive UTC text."""
    moment = value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(
        str(value)
    )  # fmt: skip
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()
