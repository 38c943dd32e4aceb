#!/usr/bin/env python
"""Measure what slow clients cost the web server (issue 8, item 4).

Starts the web server on a fresh SQLite database, opens N clients that each declare a
30 MB webhook body and send two bytes of it, then, while they hang, sends signed webhook
deliveries and agent calls one after another and times each answer. It reports those
latencies and how long the slow clients held their connections.

    .venv/bin/python scripts/measure_slow_clients.py --server zoomies --slow 50
    .venv/bin/python scripts/measure_slow_clients.py --server daphne --slow 50  # before

`--server daphne` is plain `python -m daphne` (what the controller ran before
zoomies_site/server.py); `--server zoomies` is the controller's web server with its bounds.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SECRET = "measure-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(kind: str, port: int, env: dict[str, str]) -> subprocess.Popen:
    if kind == "daphne":
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                "--access-log", os.devnull, "zoomies_site.asgi:application"]  # fmt: skip
    else:
        argv = [sys.executable, "-m", "zoomies_site.server", "--bind", f"127.0.0.1:{port}"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)


def slow_client(port: int, held: list[float]) -> None:
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            sock.sendall(
                b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n{}" % (30 * 1024 * 1024)
            )
            while sock.recv(65536):
                pass
    except OSError:
        pass
    held.append(time.monotonic() - started)


def delivery(n: int) -> tuple[bytes, dict[str, str]]:
    body = (ROOT / "tests/fixtures/github/webhooks/ping.json").read_bytes()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": f"measure-{n}",
        "X-Hub-Signature-256": f"sha256={signature}",
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", choices=("daphne", "zoomies"), default="zoomies")
    parser.add_argument("--slow", type=int, default=50, help="slow clients")
    parser.add_argument("--calls", type=int, default=40, help="deliveries and agent calls")
    options = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="zoomies-measure-"))
    env = {
        **os.environ,
        "ZOOMIES_DATA_DIR": str(data),
        "ZOOMIES_DB": str(data / "zoomies.db"),
        "ZOOMIES_GITHUB_WEBHOOK_SECRET": SECRET,
        "DJANGO_SETTINGS_MODULE": "zoomies_site.settings",
    }
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    port = free_port()
    server = start(options.server, port, env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        held: list[float] = []
        threads = [
            threading.Thread(target=slow_client, args=(port, held), daemon=True)
            for _ in range(options.slow)
        ]
        for thread in threads:
            thread.start()
        time.sleep(1)  # let them all connect and stall
        hook_ms, agent_ms, statuses = [], [], []
        with httpx.Client(timeout=30) as client:
            for n in range(options.calls):
                body, headers = delivery(n)
                t = time.monotonic()
                statuses.append(
                    client.post(f"{url}/webhooks/github", content=body, headers=headers).status_code
                )
                hook_ms.append((time.monotonic() - t) * 1000)
                t = time.monotonic()
                statuses.append(
                    client.post(
                        f"{url}/api/v1/agent/heartbeat",
                        json={},
                        headers={"Authorization": "Bearer zat_x"},
                    ).status_code
                )
                agent_ms.append((time.monotonic() - t) * 1000)
        for thread in threads:
            thread.join(timeout=90)
        still = sum(thread.is_alive() for thread in threads)

        def p(values: list[float], q: float) -> float:
            return sorted(values)[min(len(values) - 1, int(q * len(values)))]

        print(f"server={options.server} slow_clients={options.slow} calls={options.calls}")
        for what, values in (("webhook", hook_ms), ("agent", agent_ms)):
            print(
                f"{what} ms: p50 {statistics.median(values):.1f}  p95 {p(values, 0.95):.1f}  "
                f"max {max(values):.1f}"
            )
        print(f"answers: {sorted(set(statuses))}")
        if held:
            print(
                f"slow clients held: min {min(held):.1f} s  max {max(held):.1f} s; "
                f"still open after 90 s: {still}"
            )
        else:
            print(f"slow clients still open after 90 s: {still}")
    finally:
        server.terminate()
        server.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
