"""The reference receiver on loopback, with a script of failures and a log of every arrival.

`ScriptedReceiver` is a real HTTP server (capacity.receiver_reference over http.server).
Before the reference logic runs, `script` may answer a request itself: a status to return
(500 for "down"), or "hang" to hold the connection until released. Every arrival, answered
or not, is logged with its exact headers and body.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from http.server import ThreadingHTTPServer

from capacity.receiver_reference import Receiver, make_handler


@dataclass
class Arrival:
    event_id: str
    headers: dict[str, str]
    body: bytes
    status: int | None = None


class ScriptedReceiver:
    def __init__(self, secret: str, db_path: str, clock) -> None:

        self.reference = Receiver(secret, db_path, clock=clock)
        self.arrivals: list[Arrival] = []
        self.script: list[int | str] = []  # consumed one per request; empty: the reference
        self.down = False  # answer 500 to everything while set
        self.release = threading.Event()
        self.arrived = threading.Condition()
        receiver = self

        base = make_handler(self.reference)

        class Handler(base):  # type: ignore[misc, valid-type]
            def do_POST(self) -> None:
                body = self._read_body() or b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                arrival = Arrival(headers.get("x-zoomies-event-id", ""), headers, body)
                with receiver.arrived:
                    receiver.arrivals.append(arrival)
                    receiver.arrived.notify_all()
                action = receiver.script.pop(0) if receiver.script else None
                if action == "hang":
                    receiver.release.wait(30)
                    return
                if receiver.down or isinstance(action, int):
                    status, text = (action if isinstance(action, int) else 500), "receiver down"
                else:
                    status, text = receiver.reference.handle(headers, body)
                # Record before answering: the sender may read `arrivals` as soon as it
                # has the answer, and must then see the status it was given.
                with receiver.arrived:
                    arrival.status = status
                    receiver.arrived.notify_all()
                self._answer(status, text)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/capacity"

    def wait_for(self, count: int, timeout: float = 20, *, answered: bool = True) -> None:
        """Until `count` requests have arrived (and, with `answered`, been answered)."""

        def done() -> bool:
            seen = [a for a in self.arrivals if a.status is not None or not answered]
            return len(seen) >= count

        with self.arrived:
            if not self.arrived.wait_for(done, timeout):
                raise AssertionError(f"{len(self.arrivals)} arrivals, expected {count}")

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class MovableClock:
    """The test's one clock, shared by the capacity loop and the receiver's skew check."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw) -> datetime:

        self.now += timedelta(**kw)
        return self.now
