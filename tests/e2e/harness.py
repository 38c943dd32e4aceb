"""Run the real controller (`manage.py controller`) in a child process for end-to-end tests.

Everything goes over loopback HTTP: the fake GitHub lives in the test process and sends its
signed deliveries to the controller; the test reads the controller's state through its API
with a token minted by `manage.py create_token`, exactly as a script would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
MANAGE = str(ROOT / "manage.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    """Poll until `predicate()` is truthy; returns its value, or fails naming `what`."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (httpx.HTTPError, KeyError) as exc:
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} ({last_error!r})")


class Controller:
    """A controller child process over its own data dir and SQLite (or PostgreSQL) database."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "ZOOMIES_DATA_DIR": str(data_dir),
            "ZOOMIES_DB": str(data_dir / "zoomies.db"),
            "ZOOMIES_HOUSEKEEPING_TICK": "2s",
            "ZOOMIES_SCHEDULER_RECONCILE_INTERVAL": "1s",
            "ZOOMIES_GITHUB_POLL_INTERVAL": "5s",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        # A PostgreSQL run of the suite gives each controller its own database.
        if os.environ.get("ZOOMIES_DATABASE_URL"):
            self.env["ZOOMIES_DATABASE_URL"] = self._fresh_postgres(data_dir.name)
        self.log_path = data_dir / "controller.log"
        self.process: subprocess.Popen | None = None
        self.token = ""

    @staticmethod
    def _fresh_postgres(suffix: str) -> str:
        import psycopg

        base = os.environ["ZOOMIES_DATABASE_URL"]
        name = "zoomies_e2e_" + "".join(c for c in suffix.lower() if c.isalnum())[-20:]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return base.rsplit("/", 1)[0] + "/" + name

    def manage(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [sys.executable, MANAGE, *args], env=self.env, capture_output=True, text=True,
            timeout=120, cwd=ROOT,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout.strip()

    def prepare(self) -> None:
        """Migrate and mint the API token, once, before rows are added or the controller runs."""
        if self.token:
            return
        self.manage("migrate", "--verbosity", "0")
        self.token = self.manage(
            "create_token", "--user", "e2e", "--create-user", "--scope", "fleet:read",
            "--scope", "fleet:write",
        ).splitlines()[-1]  # fmt: skip

    def start(self, *extra: str) -> Controller:
        self.prepare()
        log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, MANAGE, "controller", "--bind", f"127.0.0.1:{self.port}", *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        wait_for(self._ready, 60, f"the controller on {self.url} (log: {self.log_path})")
        return self

    def _ready(self) -> bool:
        if self.process and self.process.poll() is not None:
            raise AssertionError(f"the controller exited early:\n{self.log()}")
        return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200

    def api(self, path: str, method: str = "GET", **kwargs):
        response = httpx.request(
            method, f"{self.url}/api/v1/{path}",
            headers={"Authorization": f"Bearer {self.token}"}, timeout=10, **kwargs,
        )  # fmt: skip
        response.raise_for_status()
        return response.json()

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-6000:]
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
