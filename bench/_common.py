"""What the benchmarks share: the machine line, percentiles, tables, and process clean-up.

Every process a benchmark starts is found again by something it cannot lose: the session
id of the controller (started with `start_new_session`, so daphne and the django-q2 cluster
share it) and the temporary data dir that appears on every runner process's command line.
"""

from __future__ import annotations

import datetime
import os
import platform
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.e2e.harness import kill_leftovers  # noqa: F401   # one copy, shared with the tests

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def machine() -> str:
    """One line: when, where, how many CPUs, how loaded (the numbers mean little without it)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (
        f"{now}; nproc {len(os.sched_getaffinity(0))}; load average {load}; {model or '?'}; "
        f"Python {platform.python_version()}"
    )


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`; nan when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100), at least 1
    return ordered[int(rank) - 1]


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain, right-aligned text table (markdown-compatible, so README can paste it)."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in cells]  # fmt: skip
    lines.insert(1, "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


# -- processes ---------------------------------------------------------------------------------


def _stat(pid_dir: Path) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3, state, is index 0)."""
    try:
        raw = (pid_dir / "stat").read_text()
    except OSError:
        return None
    return raw.rpartition(")")[2].split()


def _cmdline(pid_dir: Path) -> str:
    """The kernel's name for the process, then its command line: the controller's forked
    children keep its command line and say what they are by name (zoomies-web, ...)."""
    try:
        comm = (pid_dir / "comm").read_text().strip()
        cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ")
        return f"[{comm}] {cmdline.decode(errors='replace')}"
    except OSError:
        return ""


def session_processes(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session `sid`."""
    found = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        fields = _stat(pid_dir)
        if fields and len(fields) > 3 and fields[3] == str(sid):
            found[int(pid_dir.name)] = _cmdline(pid_dir)
    return found


class CpuSampler:
    """CPU seconds (user + system) of a session's processes, by role, dead ones included.

    A thread samples /proc every `every` seconds and keeps each process's last reading, so
    a django-q2 worker that is recycled (it exits after a number of tasks) still counts, less
    at most one interval of its time.
    """

    def __init__(self, sid: int, every: float = 0.1, rescan_every: int = 10):
        self.sid = sid
        self.every = every
        self.rescan_every = rescan_every
        self._members: dict[int, str] = {}
        self._samples = 0
        self._last: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.sample(rescan=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self, rescan: bool = False) -> None:
        """Read the members' CPU times; look for new members (a walk of /proc) now and then."""
        with self._lock:
            self._samples += 1
            if rescan or self._samples % self.rescan_every == 0:
                self._members = {pid: _role(c) for pid, c in session_processes(self.sid).items()}
            for pid, role in self._members.items():
                fields = _stat(Path("/proc") / str(pid))
                if fields and len(fields) > 12:
                    seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICK
                    # A process's CPU time only grows, and its role stays the one it had
                    # alive: an exited one (a zombie) reads 0 and has no command line.
                    first_role, previous = self._last.get(pid, (role, 0.0))
                    self._last[pid] = (first_role, max(seconds, previous))

    def _run(self) -> None:
        while not self._stopping.wait(self.every):
            self.sample()

    def by_role(self) -> dict[str, float]:
        self.sample(rescan=True)
        roles: dict[str, float] = {}
        with self._lock:
            for role, seconds in self._last.values():
                roles[role] = roles.get(role, 0.0) + seconds
        return roles

    def total(self) -> float:
        return sum(self.by_role().values())

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)


def _role(cmdline: str) -> str:
    if cmdline.startswith("[zoomies-web]"):
        return "web"
    if cmdline.startswith("[zoomies-workers]"):
        return "workers"
    if "daphne" in cmdline or "zoomies_site.server" in cmdline:
        return "web"
    if "qcluster" in cmdline or "cluster_child" in cmdline or "manage.py workers" in cmdline:
        return "workers"
    if "manage.py web" in cmdline:
        return "web"
    if "controller" in cmdline:
        return "controller"
    return "other"


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def listen_overflows() -> int:
    """The machine's count of TCP connections dropped because a listen queue was full.

    System-wide (other programs count too), but a rise during a run is a hint: a dropped
    connect is retried after the initial retransmission timeout, one whole second later.
    """
    try:
        lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()]
    except OSError:
        return -1
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names and names[0] == "TcpExt:" and "ListenOverflows" in names:
            return int(values[names.index("ListenOverflows")])
    return -1


def own_cpu() -> float:
    """CPU seconds this process (the load generator and the fake GitHub) has used."""
    times = os.times()
    return times.user + times.system


def kill_session(sid: int) -> None:
    """SIGKILL whatever is left of a session this benchmark started (by pid, one by one)."""
    for pid in session_processes(sid):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop_controller(controller) -> None:
    """Stop a tests.e2e.harness.Controller and anything left in its session."""
    process = controller.process
    try:
        controller.stop()
    finally:
        if process is not None:
            kill_session(process.pid)


def postgres_sessions(controller) -> int | None:
    """Sessions (connections) opened so far on this controller's PostgreSQL database."""
    url = controller.env.get("ZOOMIES_DATABASE_URL")
    if not url:
        return None
    import psycopg  # noqa: PLC0415  # only a PostgreSQL run needs it

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) - 1 if row else None  # less this one


def drop_postgres(controller) -> None:
    """Drop the database the harness created for this controller (PostgreSQL runs only)."""
    url = controller.env.get("ZOOMIES_DATABASE_URL")
    if not url:
        return
    import psycopg  # noqa: PLC0415  # only a PostgreSQL run needs it

    name = url.rpartition("/")[2]
    with psycopg.connect(os.environ["ZOOMIES_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sigterm_raises() -> None:
    """SIGTERM unwinds like Ctrl-C, so the `finally` blocks that clean up still run."""

    def raise_interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, raise_interrupt)


def flush() -> None:
    sys.stdout.flush()


# -- memory ------------------------------------------------------------------------------------


def process_memory(pid: int) -> tuple[float, float] | None:
    """(RSS, PSS) of one process in MB from /proc/<pid>/smaps_rollup; None if it is gone.

    PSS shares each page among the processes mapping it, so the PSS of a process tree adds
    up to what the tree really costs the machine, where RSS counts shared pages once per
    process.
    """
    values = {}
    try:
        for line in (Path("/proc") / str(pid) / "smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                values[key] = int(rest.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    if "Rss" not in values or "Pss" not in values:
        return None
    return values["Rss"], values["Pss"]


def session_memory(sid: int) -> list[tuple[int, str, float, float]]:
    """(pid, role, RSS MB, PSS MB) of every live process of session `sid`."""
    found = []
    for pid, cmdline in sorted(session_processes(sid).items()):
        memory = process_memory(pid)
        if memory is not None:
            found.append((pid, _role(cmdline), memory[0], memory[1]))
    return found
