"""Run the real controller (`manage.py controller`) in a child process for end-to-end tests.

Everything goes over loopback HTTP: the fake GitHub lives in the test process and sends its
signed deliveries to the controller; the test reads the controller's state through its API
with a token minted by `manage.py create_token`, exactly as a script would.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg

from tests import postgres_databases
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
MANAGE = str(ROOT / "manage.py")
# What `manage.py controller` prints once its own web server answers (its command module).
READY_LINE = "Zoomies controller ready on "


# The migrated database (with the e2e user's token) that each controller starts from, made
# once per process and per database kind: a migrate and a create_token in child processes
# cost seconds of CPU, and every end-to-end test used to pay them.
_TEMPLATES: dict[str, tuple[str, str]] = {}


# A port handed to a child process is free only when picked: the child binds it a second
# or more later. Picked from the kernel's ephemeral range (bind(0), every outgoing
# connection), any other test's server or client could take it in between, and a
# controller of another worker answering on "our" port once failed a test with a 401 (its
# database has another token). So ports come from below that range, and each is reserved
# by a lock file that this process holds until it exits: no other run or worker of this
# machine picks it meanwhile.
PORT_LOCKS = Path(tempfile.gettempdir()) / "zoomies-test-ports"
_reserved: dict[int, int] = {}  # port -> the lock file's descriptor, held open


def _unshared_ports() -> range:
    """The ports below the kernel's ephemeral range (bind(0) and connect() take theirs there)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, low) if low > 12000 else range(61000, 65536)


def free_port() -> int:
    """A loopback port nobody listens on, reserved for this process (see PORT_LOCKS)."""
    PORT_LOCKS.mkdir(exist_ok=True)
    ports = _unshared_ports()
    for _ in range(500):
        port = random.choice(ports)
        if port in _reserved:
            continue
        fd = os.open(PORT_LOCKS / str(port), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # another process holds it
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                os.close(fd)  # something else on this machine uses it
                continue
        _reserved[port] = fd
        return port
    raise RuntimeError(f"no free port in {ports} after 500 tries ({PORT_LOCKS})")


def kill_leftovers(marker: str) -> int:
    """SIGKILL processes whose command line names `marker` (a test's or bench's temp dir).

    Runner processes are detached on purpose (a stopping agent leaves them running), so the
    test or benchmark that started them takes them away; returns how many it found.
    """
    killed = 0
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            pid = int(pid_dir.name)
            try:
                # A runner's shim leads its own process group: take the runner with it.
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def wait_for(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.2):
    """tests/waiting.py's wait, where a controller still starting answers with errors."""
    return wait_until(predicate, timeout, what, every=every, tolerate=(httpx.HTTPError, KeyError))


class Controller:
    """A controller child process over its own data dir and SQLite (or PostgreSQL) database.

    `ca` (a PEM file) means the controller serves HTTPS (its env sets server.tls_*), and the
    harness verifies it against that CA.
    """

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, ca: Path | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(ca)) if ca else True
        )
        self.env = {
            **os.environ,
            "ZOOMIES_DATA_DIR": str(data_dir),
            "ZOOMIES_DB": str(data_dir / "zoomies.db"),
            "ZOOMIES_HOUSEKEEPING_TICK": "2s",
            "ZOOMIES_SCHEDULER_RECONCILE_INTERVAL": "1s",
            "ZOOMIES_GITHUB_POLL_INTERVAL": "5s",
            # The load these drills see is the test run's own on a shared 2-core machine:
            # held or throttled, the embedded host would time what the tests make, not what
            # they test (the hold and the throttle have tests of their own).
            "ZOOMIES_SCHEDULER_HOST_THROTTLING": "false",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        # A PostgreSQL run of the suite gives each controller its own database.
        if os.environ.get("ZOOMIES_DATABASE_URL"):
            self.env["ZOOMIES_DATABASE_URL"] = self._fresh_postgres()
        self.log_path = data_dir / "controller.log"
        self.process: subprocess.Popen | None = None
        self.token = ""

    @staticmethod
    def _fresh_postgres() -> str:
        """A database of this controller's own, named for this process (tests/
        postgres_databases.py), so two runs sharing one server never meet; it is dropped by
        `drop_database`, or at the latest when the session ends."""
        return postgres_databases.create(os.environ["ZOOMIES_DATABASE_URL"])

    def manage(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [sys.executable, MANAGE, *args], env=self.env, capture_output=True, text=True,
            timeout=120, cwd=ROOT,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout.strip()

    def prepare(self) -> None:
        """A migrated database with the e2e user's API token, once, before rows are added or
        the controller runs: a copy of this process's template (the same migrations and
        token, made once; `manage.py migrate` and `create_token` ran there, for real)."""
        if self.token:
            return
        postgres = "ZOOMIES_DATABASE_URL" in self.env
        kind = "postgresql" if postgres else "sqlite"
        if kind not in _TEMPLATES:
            _TEMPLATES[kind] = self._make_template(postgres)
        source, self.token = _TEMPLATES[kind]
        if postgres:
            name = self.env["ZOOMIES_DATABASE_URL"].rsplit("/", 1)[1]
            with psycopg.connect(os.environ["ZOOMIES_DATABASE_URL"], autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{name}"')
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        else:
            shutil.copyfile(source, self.env["ZOOMIES_DB"])

    def _make_template(self, postgres: bool) -> tuple[str, str]:
        where = Path(tempfile.mkdtemp(prefix="zoomies-e2e-template-"))
        atexit.register(shutil.rmtree, where, True)
        env = {**self.env, "ZOOMIES_DATA_DIR": str(where), "ZOOMIES_DB": str(where / "t.db")}
        if postgres:
            env["ZOOMIES_DATABASE_URL"] = self._fresh_postgres()
        template = Controller.__new__(Controller)
        template.env = env
        template.manage("migrate", "--verbosity", "0")
        token = template.manage(
            "create_token", "--user", "e2e", "--create-user", "--scope", "fleet:read",
            "--scope", "fleet:write",
        ).splitlines()[-1]  # fmt: skip
        source = env["ZOOMIES_DATABASE_URL"].rsplit("/", 1)[1] if postgres else env["ZOOMIES_DB"]
        return source, token

    def start(self, *extra: str, run_script: bool = False, ready: bool = True) -> Controller:
        """`manage.py controller`, or with `run_script` the README's `scripts/run.sh`; with
        `ready` false it returns at once, for a start the test watches itself."""
        self.prepare()
        self._keep_previous_log()
        log = self.log_path.open("w")
        command = [str(ROOT / "scripts" / "run.sh")] if run_script else [
            sys.executable, MANAGE, "controller"
        ]  # fmt: skip
        self.process = subprocess.Popen(
            [*command, "--bind", f"127.0.0.1:{self.port}", *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        if ready:
            wait_for(self._ready, 60, f"the controller on {self.url} (log: {self.log_path})")
        return self

    def _keep_previous_log(self) -> None:
        """Move an earlier process's log aside (controller.1.log, .2, ...) so that a test
        which restarts the controller, a kill drill above all, keeps every process's log;
        `log()` and `log_path` stay the running one's."""
        if not self.log_path.exists() or not self.log_path.stat().st_size:
            return
        n = 1
        while (kept := self.log_path.with_name(f"controller.{n}.log")).exists():
            n += 1
        self.log_path.rename(kept)

    def _ready(self) -> bool:
        if self.process and self.process.poll() is not None:
            raise AssertionError(f"the controller exited early:\n{self.log()}")
        # Its own line first: /healthz alone could be answered by another process holding
        # the port while this one is still starting (and about to fail to bind it).
        if READY_LINE not in self._full_log():
            return False
        response = httpx.get(f"{self.url}/healthz", timeout=2, verify=self.verify)
        return response.status_code == 200

    def api(self, path: str, method: str = "GET", **kwargs):
        response = httpx.request(
            method, f"{self.url}/api/v1/{path}",
            headers={"Authorization": f"Bearer {self.token}"}, timeout=10, verify=self.verify,
            **kwargs,
        )  # fmt: skip
        response.raise_for_status()
        body = response.json()
        # A list answers in cursor pages: follow them, so callers see every row.
        while isinstance(body, dict) and "results" in body and method == "GET":
            rows = list(body["results"])
            if not body.get("next"):
                return rows
            more = httpx.get(
                body["next"], headers={"Authorization": f"Bearer {self.token}"}, timeout=10,
                verify=self.verify,
            )  # fmt: skip
            more.raise_for_status()
            body = {**more.json(), "results": rows + more.json()["results"]}
        return body

    def reconcile_passes(self) -> int:
        """How many reconcile passes the controller has finished (its /metrics count)."""
        response = httpx.get(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.token}"},
            timeout=10, verify=self.verify,
        )  # fmt: skip
        response.raise_for_status()
        for line in response.text.splitlines():
            if line.startswith("zoomies_reconcile_pass_seconds_count"):
                return int(float(line.split()[-1]))
        return 0

    def wait_reconcile_passes(self, count: int = 2, timeout: float = 60) -> None:
        """Wait until `count` more reconcile passes have finished: after it, whatever the
        state before the call woke has been acted on (a barrier instead of a sleep)."""
        target = self.reconcile_passes() + count
        wait_for(lambda: self.reconcile_passes() >= target, timeout, f"{count} reconcile passes")

    def log(self) -> str:
        return self._full_log()[-6000:]

    def _full_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the controller alone, as a crash would; its children die with it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        wait_for(self._port_closed, 30, f"port {self.port} to close after the kill")

    def _port_closed(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) != 0

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def drop_database(self) -> None:
        """Stop the controller and drop its PostgreSQL database, for a test that is done
        with it (stop alone keeps it: a test may start the controller again on its rows)."""
        self.stop()
        url = self.env.get("ZOOMIES_DATABASE_URL")
        if url and os.environ.get("ZOOMIES_DATABASE_URL"):
            postgres_databases.drop(os.environ["ZOOMIES_DATABASE_URL"], url.rsplit("/", 1)[1])
