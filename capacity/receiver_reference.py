"""A reference receiver for capacity events, in Python (CAP-19..21).

The contract's Go handler, made durable: it reads at most 64 KiB, checks the signature in
constant time, refuses a schema_version it does not know, rejects a timestamp outside a
small skew window, records the event id under a unique constraint before acting, and sets
the pool's target to `current_capacity + required_runner_slots`, answering 204 only once
that is committed. A duplicate event id is answered 204 and changes nothing.

Run it beside an autoscaler to watch what Zoomies sends:

    python -m capacity.receiver_reference --secret-file secret.txt --port 9300 --db r.db

It imports nothing of Django; `set_target` is the hook an autoscaler adapter replaces.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 64 << 10
SCHEMA_VERSION = 1
DEFAULT_SKEW = timedelta(minutes=5)
# Keep event ids at least as long as the sender's cooldown (5 min by default), and more.
DEFAULT_RETENTION = timedelta(hours=1)

SetTarget = Callable[[sqlite3.Connection, str, int, str], None]


def store_target(db: sqlite3.Connection, pool_id: str, target: int, event_id: str) -> None:
    """The default action: the pool's desired capacity, in runner slots."""
    db.execute(
        "INSERT INTO targets (pool_id, target, event_id) VALUES (?, ?, ?) "
        "ON CONFLICT(pool_id) DO UPDATE SET target = excluded.target, "
        "event_id = excluded.event_id",
        (pool_id, target, event_id),
    )


class Receiver:
    """The receiver's logic over one SQLite file; `handle` maps a request to an answer."""

    def __init__(
        self,
        secret: str | bytes,
        db_path: str,
        *,
        skew: timedelta = DEFAULT_SKEW,
        retention: timedelta = DEFAULT_RETENTION,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        set_target: SetTarget = store_target,
    ) -> None:
        self.secret = secret.encode() if isinstance(secret, str) else secret
        self.db_path = db_path
        self.skew = skew
        self.retention = retention
        self.clock = clock
        self.set_target = set_target
        self._lock = threading.Lock()
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS events (event_id TEXT PRIMARY KEY, "
                "type TEXT NOT NULL, pool_id TEXT NOT NULL, received_at TEXT NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS targets (pool_id TEXT PRIMARY KEY, "
                "target INTEGER NOT NULL, event_id TEXT NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=10, isolation_level=None)

    def handle(self, headers: dict[str, str], body: bytes | None) -> tuple[int, str]:
        if body is None:
            return 400, "bad body"
        mac = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        given = headers.get("x-zoomies-signature-256", "")
        if not hmac.compare_digest(("sha256=" + mac).encode(), given.encode()):
            return 401, "bad signature"
        try:
            event = json.loads(body)
        except ValueError:
            return 400, "bad event"
        if not isinstance(event, dict) or not isinstance(event.get("event_id"), str):
            return 400, "bad event"
        if not event["event_id"]:
            return 400, "bad event"
        if event.get("schema_version") != SCHEMA_VERSION:
            return 400, "unknown schema version"
        try:
            sent_at = datetime.strptime(event["timestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=UTC
            )
            pool_id = str(event["pool_id"])
            target = int(event["current_capacity"]) + int(event["required_runner_slots"])
        except (KeyError, TypeError, ValueError):
            return 400, "bad event"
        now = self.clock()
        if abs(now - sent_at) > self.skew:
            return 400, "timestamp outside the clock-skew window"
        with self._lock, self._connect() as db:
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute(
                    "DELETE FROM events WHERE received_at < ?",
                    ((now - self.retention).isoformat(),),
                )
                try:
                    db.execute(
                        "INSERT INTO events (event_id, type, pool_id, received_at) "
                        "VALUES (?, ?, ?, ?)",
                        (event["event_id"], str(event.get("type", "")), pool_id, now.isoformat()),
                    )
                except sqlite3.IntegrityError:
                    db.execute("ROLLBACK")
                    return 204, "duplicate"  # the second arrival of one event is no new demand
                if event.get("type") in ("capacity_demand", "scale_down_opportunity"):
                    self.set_target(db, pool_id, max(0, target), event["event_id"])
                db.execute("COMMIT")
            except Exception:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                return 503, "autoscaler unavailable"
        return 204, ""

    def targets(self) -> dict[str, int]:
        with self._connect() as db:
            return dict(db.execute("SELECT pool_id, target FROM targets").fetchall())

    def event_ids(self) -> list[str]:
        with self._connect() as db:
            return [row[0] for row in db.execute("SELECT event_id FROM events ORDER BY rowid")]


def make_handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self._read_body()
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, text = receiver.handle(headers, body)
            self._answer(status, text)

        def _read_body(self) -> bytes | None:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                return None
            if length < 0 or length > MAX_BODY:
                return None
            data = self.rfile.read(length)
            return data if len(data) == length else None

        def _answer(self, status: int, text: str) -> None:
            payload = text.encode()
            self.send_response(status)
            if status != 204:
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if status != 204:
                self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def serve(receiver: Receiver, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A started server on a daemon thread; `server.server_address` has the port."""
    server = ThreadingHTTPServer((host, port), make_handler(receiver))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9300)
    parser.add_argument("--db", default="capacity-receiver.db")
    parser.add_argument("--secret-file", required=True, help="holds the signing secret")
    args = parser.parse_args()
    with open(args.secret_file) as handle:
        secret = handle.read().strip()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(Receiver(secret, args.db)))
    print(f"listening on http://{args.host}:{server.server_address[1]}/")
    server.serve_forever()


if __name__ == "__main__":
    main()
