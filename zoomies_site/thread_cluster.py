"""django-q2's cluster in one process: its pusher, monitor and workers as threads.

django-q2's own cluster is six processes for two workers (the `qcluster` parent, the
sentinel, the pusher, the monitor and the workers), four of which only wait, and each
forked Python process costs 18 to 28 MB of PSS here (docs/performance.md, "Memory"). Our
tasks spend their time waiting on the database, GitHub or an agent, not computing, so
threads lose nothing a process would give them. Here the same django-q2 functions run as
threads of the one process: `pusher` takes tasks off the broker (our wakeable ORM broker,
or Redis), `worker` runs them, `monitor` saves their results and acknowledges them, and
the guard loop below does what the sentinel's does (a dead thread is started again, the
schedule is looked at every 30 s). Tasks, retries, results and the admin's task pages are
django-q2's as before.

What a thread cannot give: a task past its timeout cannot be killed. The guard counts a
busy worker's time down as the sentinel does; one that runs out is left to finish on its
own (it takes no further task) and a fresh worker takes its place, with a critical log
line. A process that has abandoned `MAX_ABANDONED` workers that still run exits, so the
controller exits and its service manager starts it afresh (`ZOOMIES_Q_CLUSTER=processes`
keeps django-q2's cluster of processes, whose workers are killed instead).
"""

from __future__ import annotations

import logging
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.monitor import monitor
from django_q.pusher import pusher
from django_q.scheduler import scheduler
from django_q.worker import worker

log = logging.getLogger("zoomies.workers")

MAX_ABANDONED = 4
SCHEDULE_EVERY = 30.0  # seconds, as django-q2's sentinel
STOP_JOIN_SECONDS = 10.0
IDLE = -1.0
RECYCLED = -2.0


class WorkerTimer:
    """django-q2's per-worker `Value("f")`: seconds left on the running task, IDLE, RECYCLED,
    or 0 once timed out; the worker and the guard share it under its lock."""

    def __init__(self) -> None:
        self.value = IDLE
        self._lock = threading.Lock()

    def get_lock(self) -> threading.Lock:
        return self._lock


class WorkerInbox:
    """The task queue as one worker sees it: once the guard has given up on the worker
    (its task ran past the timeout), its next `get` is django-q2's stop pill."""

    def __init__(self, tasks: queue.Queue) -> None:
        self.tasks = tasks
        self.abandoned = False

    def get(self) -> Any:
        return "STOP" if self.abandoned else self.tasks.get()


class WorkerThread:
    def __init__(self, number: int, tasks: queue.Queue, results: queue.Queue, timeout: int):
        self.timer = WorkerTimer()
        self.inbox = WorkerInbox(tasks)
        self.thread = _thread(
            f"q-worker-{number}", worker, self.inbox, results, self.timer, timeout
        )


def _thread(name: str, target: Callable[..., None], *args: object) -> threading.Thread:
    def run() -> None:
        try:
            target(*args)
        except Exception:
            log.exception("%s failed", name)
        finally:
            connections.close_all()  # this thread's own; a new one opens its own

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class ThreadCluster:
    """django-q2's cluster as threads: `start()` it, `stop()` it; `finished` is set once it
    has stopped in django-q2's order: the pusher (no new task is taken), the workers (each
    finishes what it runs), the monitor (every result saved). `failure` says why, if it
    stopped on its own."""

    def __init__(self, *, workers: int | None = None, timeout: int | None = None) -> None:
        self.size = int(workers or Conf.WORKERS)
        self.timeout = int(timeout or Conf.TIMEOUT or -1)
        self.tasks: queue.Queue = queue.Queue(maxsize=Conf.QUEUE_LIMIT or 0)
        self.results: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.failure: str | None = None
        self.pushing_done = threading.Event()  # django-q2's `event_out`: the pusher's stop
        self.pool: list[WorkerThread] = []
        self.abandoned: list[WorkerThread] = []
        self.spawned = 0
        self.pusher: threading.Thread | None = None
        self.monitor: threading.Thread | None = None

    def start(self) -> None:
        get_broker().ping()
        for _ in range(self.size):
            self._spawn_worker()
        self.monitor = _thread("q-monitor", monitor, self.results, get_broker())
        self.pusher = _thread("q-pusher", pusher, self.tasks, self.pushing_done, get_broker())
        threading.Thread(target=self._guard_then_stop, name="q-guard", daemon=True).start()
        log.info("task cluster running: %d worker threads", self.size)

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        """The cluster as a process of its own (`manage.py workers`, or the controller's
        child under ZOOMIES_Q_CLUSTER=processes): until SIGTERM or SIGINT."""
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        self.start()
        while not self.finished.wait(0.5):  # short waits: the signal handlers run between
            pass
        if self.failure:
            raise SystemExit(self.failure)

    def _spawn_worker(self) -> None:
        self.spawned += 1
        self.pool.append(WorkerThread(self.spawned, self.tasks, self.results, self.timeout))

    def _guard_then_stop(self) -> None:
        try:
            self._guard()
        except TooManyAbandoned as exc:
            self.failure = str(exc)
            log.critical("the task cluster stops: %s", exc)
        except Exception as exc:
            self.failure = f"the task guard failed: {exc}"
            log.exception("the task guard failed")
        finally:
            try:
                self._stop()
            finally:
                connections.close_all()
                self.finished.set()

    def _guard(self) -> None:
        broker = get_broker()
        since_schedule = 0.0
        cycle = float(Conf.GUARD_CYCLE)
        while not self.stopping.wait(cycle):
            self.guard_once(cycle)
            since_schedule += cycle
            if since_schedule >= SCHEDULE_EVERY and Conf.SCHEDULER:
                since_schedule = 0.0
                try:
                    scheduler(broker=broker)
                except Exception:
                    log.exception("django-q2's schedule could not be read")
                finally:
                    connections.close_all()

    def guard_once(self, cycle: float) -> None:
        """One round of the sentinel's guard: count busy workers down, replace a worker that
        ended (recycled, or failed) or timed out, restart a dead pusher or monitor."""
        for member in list(self.pool):
            with member.timer.get_lock():
                timed_out = member.timer.value == 0
                if member.thread.is_alive() and not timed_out:
                    if member.timer.value > 0:
                        member.timer.value = max(0.0, member.timer.value - cycle)
                    continue
            self.pool.remove(member)
            if timed_out and member.thread.is_alive():
                member.inbox.abandoned = True
                self.abandoned.append(member)
                log.critical(
                    "a task ran past its timeout (%d s) on %s: that thread is left to finish "
                    "and takes no more tasks; a new worker takes its place",
                    self.timeout, member.thread.name,
                )  # fmt: skip
            elif member.timer.value != RECYCLED:
                log.critical("worker %s ended; a new one takes its place", member.thread.name)
            self._spawn_worker()
        self.abandoned = [m for m in self.abandoned if m.thread.is_alive()]
        if len(self.abandoned) >= MAX_ABANDONED:
            # Each holds a thread (and maybe a lease) for ever: a fresh process is the cure.
            raise TooManyAbandoned(f"{len(self.abandoned)} tasks past their timeout still run")
        if self.monitor is not None and not self.monitor.is_alive():
            log.critical("the task monitor ended; a new one takes its place")
            self.monitor = _thread("q-monitor", monitor, self.results, get_broker())
        if self.pusher is not None and not self.pusher.is_alive() and not self.stopping.is_set():
            log.critical("the task pusher ended; a new one takes its place")
            self.pusher = _thread("q-pusher", pusher, self.tasks, self.pushing_done, get_broker())

    def _stop(self) -> None:
        log.info("task cluster stopping")
        self.pushing_done.set()
        if self.pusher is not None:
            self.pusher.join(STOP_JOIN_SECONDS)  # the broker's wait ends within its poll
        for _ in self.pool:
            self.tasks.put("STOP")
        for member in self.pool:
            member.thread.join()
        self.results.put("STOP")
        if self.monitor is not None:
            self.monitor.join(STOP_JOIN_SECONDS)
        log.info("task cluster stopped")


class TooManyAbandoned(Exception):
    pass


class InProcessCluster:
    """The controller's handle on a ThreadCluster in its own process, with a forked child's
    poll / terminate / wait / kill (zoomies_site/core/forked.py), so the controller watches
    and stops it as it does the web server."""

    def __init__(self) -> None:
        self.args = ["task cluster"]
        self.returncode: int | None = None
        self.killed = False
        self.cluster = ThreadCluster()
        self.cluster.start()

    def poll(self) -> int | None:
        if self.returncode is None and self.cluster.finished.is_set():
            self.returncode = 1 if self.cluster.failure else 0
        return self.returncode

    def terminate(self) -> None:
        self.cluster.stop()

    def kill(self) -> None:
        """A thread cannot be killed: the cluster is told to stop and is given up on (its
        threads end with the process)."""
        self.cluster.stop()
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        if not self.cluster.finished.wait(timeout):
            if self.killed:
                return -9
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.poll() or 0
