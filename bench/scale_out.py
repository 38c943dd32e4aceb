"""The scale-out shape for the benchmarks (docs/deployment.md): `web` processes of `manage.py
web` sharing one port (SO_REUSEPORT) and one `manage.py workers`, over a PostgreSQL database
and a Redis prefix of their own, all started by one shell that waits on them, so that the
benchmarks' CPU and memory samplers (one session) count every one of them.

It answers what the benchmarks use of tests/e2e/harness.Controller (`url`, `port`, `env`,
`process`, `prepare`, `manage`, `start`, `api`, `log`, `stop`), so a benchmark runs either
shape with the same code.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench._common import kill_session
from tests import postgres_databases
from tests.e2e.harness import MANAGE, ROOT, free_port

POSTGRES_URL = os.environ.get("ZOOMIES_TEST_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ZOOMIES_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


class ScaleOut:
    def __init__(self, data_dir: Path, web: int, env: dict[str, str] | None = None) -> None:
        self.web = web
        self.shape = f"{web} web + 1 workers, PostgreSQL + Redis"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database = postgres_databases.create(POSTGRES_URL)
        self.log_path = data_dir / "scale-out.log"
        self.env = {
            **os.environ,
            "ZOOMIES_DATA_DIR": str(data_dir),
            "ZOOMIES_DATABASE_URL": self.database,
            "ZOOMIES_REDIS_URL": REDIS_URL,
            "ZOOMIES_REDIS_PREFIX": f"zoomies-bench-{os.getpid()}-{self.port}",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.env.pop("ZOOMIES_DB", None)
        self.process: subprocess.Popen | None = None
        self.token = ""

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, MANAGE, *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr[-2000:]}")
        return done.stdout.strip()

    def prepare(self) -> None:
        """Migrated, with an API token for `api`."""
        self.manage("migrate", "--verbosity", "0")
        self.token = self.manage(
            "create_token", "--user", "bench", "--create-user", "--scope", "fleet:read",
            "--scope", "fleet:write",
        ).splitlines()[-1]  # fmt: skip

    def start(self, *_controller_flags: str) -> ScaleOut:
        """The web processes and the workers; a controller's flags (`--no-agent`) do not
        apply: this shape runs no embedded agent."""
        web = (f"{shlex.quote(sys.executable)} {shlex.quote(str(MANAGE))} web "
               f"--bind 127.0.0.1:{self.port} --reuse-port")  # fmt: skip
        workers = f"{shlex.quote(sys.executable)} {shlex.quote(str(MANAGE))} workers"
        script = " ".join([f"{web} &"] * self.web + [f"{workers} &", "wait"])
        self.process = subprocess.Popen(
            ["bash", "-c", script], env=self.env, cwd=ROOT, start_new_session=True,
            stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while not _healthy(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the web tier did not start: {self.log()}")
            time.sleep(0.5)
        time.sleep(2.0 + self.web)  # every web process listening, not only the first
        return self

    def api(self, path: str, method: str = "GET", **kwargs):
        """As the harness's: a list's cursor pages followed, so every row is returned."""
        headers = {"Authorization": f"Bearer {self.token}"}
        answer = httpx.request(method, f"{self.url}/api/v1/{path}", headers=headers,
                               timeout=30, **kwargs)  # fmt: skip
        answer.raise_for_status()
        body = answer.json()
        rows: list = []
        while isinstance(body, dict) and "results" in body:
            rows += body["results"]
            if not body.get("next"):
                return rows
            more = httpx.get(body["next"], headers=headers, timeout=30)
            more.raise_for_status()
            body = more.json()
        return body

    def log(self) -> str:
        if not self.log_path.exists():
            return "(nothing started yet)"
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process is not None:
            kill_session(self.process.pid)
            self.process.wait(30)
            self.process = None

    def drop_database(self) -> None:
        postgres_databases.drop(POSTGRES_URL, self.database.rsplit("/", 1)[1])


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return conn.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False
