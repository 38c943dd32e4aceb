"""What a runner-log viewer that never reads costs the web server (LOG-05).

    .venv/bin/python bench/log_relay.py [--megabytes 100] [--viewers 2]

A temporary data dir and SQLite database hold one host, one runner and a viewer's API
token. The web server is started as a child process; `--viewers` raw sockets each send
`GET /api/v1/runners/{id}/logs` and then never read a byte. This process, holding the
host's agent token, POSTs `--megabytes` of output in 48 KiB chunks to the stream's
`/api/v1/agent/logs/{stream_id}` as an agent would, and the server's resident memory
(VmRSS from /proc) is read before and after.

Two servers, in the same run and with the same bytes:

* `zoomies`: `python -m zoomies_site.server`, the controller's web server, whose streamed
  sends wait while the client's socket is full, so the relay's bounded per-viewer queue
  (fleet/logs.py, 256 KiB) is what fills and drops;
* `daphne`: plain `daphne zoomies_site.asgi:application`, which writes whatever the
  application sends into twisted's buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import machine, table  # noqa: E402
from tests.e2e.harness import free_port, wait_for  # noqa: E402

CHUNK = ("x" * 99 + "\n") * (48 * 1024 // 100)
SETUP = """
import json
from django.utils import timezone
from accounts.actions import create_api_token, create_user
from fleet import actions
from runners.models import Pool, Runner
now = timezone.now()
_, join = actions.create_join_token(now=now, actor="bench")
host, agent_token = actions.join_host(
    join_token=join, name="bench-host", facts={"capacity": 1, "backends": ["process"]}, now=now
)
pool = Pool.objects.create(name="bench-pool", backend="process", labels=["bench"])
runner = Runner.objects.create(
    name="bench-pool-1", pool=pool, host=host, state="idle", created_at=now,
    state_changed_at=now,
)
user = create_user(username="bench-viewer", role="viewer", password=None, actor="bench")
_, api_token = create_api_token(user=user, name="bench", scopes=["fleet:read"], actor="bench")
print(json.dumps({"agent": agent_token, "api": api_token, "runner": runner.pk}))
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def never_reading_viewer(port: int, runner: int, token: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    # The smallest receive buffer the kernel allows, so the kernel's own queue is not what
    # hides the server's growth.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(
        f"GET /api/v1/runners/{runner}/logs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    return sock


def stream_id(db: Path, after: int) -> tuple[int, str]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT id, payload FROM fleet_agenttask WHERE kind='stream_logs' AND id>? "
            "ORDER BY id DESC LIMIT 1",
            (after,),
        ).fetchone()
    if row is None:
        raise LookupError("no stream yet")
    return row[0], json.loads(row[1])["stream_id"]


def run(kind: str, env: dict, db: Path, ids: dict, megabytes: int, viewers: int, last: int):
    port = free_port()
    if kind == "zoomies":
        command = [sys.executable, "-m", "zoomies_site.server", "--bind", f"127.0.0.1:{port}"]
    else:
        daphne = str(Path(sys.executable).with_name("daphne"))
        command = [daphne, "-b", "127.0.0.1", "-p", str(port), "zoomies_site.asgi:application"]
    log = open(Path(env["ZOOMIES_DATA_DIR"]) / f"{kind}.log", "w")
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    sockets = []
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, f"the {kind} server")
        sockets = [never_reading_viewer(port, ids["runner"], ids["api"]) for _ in range(viewers)]
        found: dict[str, object] = {}

        def opened() -> bool:
            try:
                found["task"], found["stream"] = stream_id(db, last)
                return True
            except LookupError:
                return False

        wait_for(opened, 30, "the stream_logs task")
        agent = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {ids['agent']}"}, timeout=30
        )
        chunk_url = f"/api/v1/agent/logs/{found['stream']}"
        body = json.dumps({"data": CHUNK})
        warm = 4 * 1024 * 1024 // len(CHUNK)
        for _ in range(warm):  # past the kernel's buffers and the queues' bounds
            agent.post(chunk_url, content=body).raise_for_status()
        time.sleep(1)
        before = rss_kib(server.pid)
        count = megabytes * 1024 * 1024 // len(CHUNK)
        started = time.monotonic()
        for _ in range(count):
            agent.post(chunk_url, content=body).raise_for_status()
        took = time.monotonic() - started
        time.sleep(1)
        after = rss_kib(server.pid)
        agent.close()
        row = [kind, viewers, megabytes, f"{before / 1024:.1f}", f"{after / 1024:.1f}",
               f"{(after - before) / 1024:+.1f}", f"{count / took:.0f}"]  # fmt: skip
        return row, int(found["task"])
    finally:
        for sock in sockets:
            sock.close()
        server.terminate()
        server.wait(20)
        log.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--viewers", type=int, default=2)
    options = parser.parse_args(argv)
    print(machine())
    with tempfile.TemporaryDirectory(prefix="zoomies-bench-logs-") as tmp:
        db = Path(tmp) / "zoomies.db"
        env = {
            **os.environ,
            "ZOOMIES_DATA_DIR": tmp,
            "ZOOMIES_DB": str(db),
            "ZOOMIES_CONFIG_FILE": str(Path(tmp) / "absent.yaml"),
            "DJANGO_SETTINGS_MODULE": "zoomies_site.settings",
        }
        env.pop("ZOOMIES_DATABASE_URL", None)
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
        out = subprocess.run(
            [*manage, "shell", "-c", SETUP], env=env, cwd=ROOT, check=True,
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        ids = json.loads(out.strip().splitlines()[-1])
        rows, last = [], 0
        for kind in ("zoomies", "daphne"):
            row, last = run(kind, env, db, ids, options.megabytes, options.viewers, last)
            rows.append(row)
            print(table(["server", "viewers", "MB posted", "RSS before MB", "RSS after MB",
                         "growth MB", "chunks/s"], rows), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
