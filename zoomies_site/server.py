"""The controller's web server: daphne serving `zoomies_site.asgi`, with HTTPS and bounds.

`main(["--bind", "HOST:PORT", ...])` is what the controller's forked web server runs
(zoomies_site/core/forked.py); `python -m zoomies_site.server --bind HOST:PORT
[--internal-port N]` runs it alone. It reads the registry for:

- `server.tls_cert` / `server.tls_key`: when both are set the bind speaks HTTPS from them
  (twisted's `ssl:` endpoint), and `--internal-port` adds a plain-HTTP listener on
  127.0.0.1 for the controller's own embedded agent and readiness check, which cannot be
  expected to verify a certificate issued for the public name.
- `server.request_timeout`: daphne reads a request's whole body before the application sees
  it, and twisted lets a client that keeps a connection idle hold it for a minute. Here a
  request's body must keep coming (no stall as long as the timeout) and the whole request
  must arrive within the timeout plus a second per MiB of declared body; otherwise the
  client is answered 408 and disconnected. Between requests the connection idles out after
  the same timeout.
- `server.max_request_body`: the largest body any route reads; a larger declared (or, when
  chunked, received) body is answered 413 before it is read, with one log line. Routes
  refuse smaller bodies themselves (webhooks above `github.webhook_max_body`).
- `server.max_connections_per_client`: one client address cannot hold more connections
  than this, so a few slow clients cannot take the file descriptors GitHub's deliveries and
  the agents need. The internal listener is not counted: it is the controller's own (its
  embedded agent and readiness check), and 64 slow loopback clients on the bind locked
  them out (issue 21 item 12). Behind a proxy (`server.tls_proxy`) every client arrives
  from the proxy's address, so there the cap counts the requests in flight per client as
  the proxy names it (the last address of X-Forwarded-For) and answers 429 past it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# daphne installs the asyncio reactor on import; it must come before anything else of twisted.
import daphne.server  # isort: skip
from daphne.http_protocol import HTTPFactory, WebRequest
from django.conf import settings
from twisted.internet import reactor
from twisted.internet.endpoints import quoteStringArgument

log = logging.getLogger("zoomies.server")

MIB = 1024 * 1024
DRAIN_POLL = 0.05  # how often a paused stream looks whether its client has read
SECONDS_PER_MIB = 1.0
# At a stop, how long the webhook inbox's applier may go on recording what it keeps.
INBOX_STOP_SECONDS = 5.0
REASONS = {408: b"Request Timeout", 413: b"Content Too Large", 429: b"Too Many Requests"}
WHY = {
    408: "the request did not arrive within server.request_timeout",
    413: "the request body is larger than server.max_request_body",
    429: "this client has server.max_connections_per_client requests in flight already",
}
LOOPBACK = {"127.0.0.1", "::1"}


@dataclass(frozen=True)
class Limits:
    request_timeout: float
    max_body: int
    max_per_client: int

    def budget(self, length: int | None) -> float:
        """Seconds a request may take to arrive, headers included, for a declared length."""
        return self.request_timeout + SECONDS_PER_MIB * (length or 0) / MIB


def limits_from_registry() -> Limits:
    from zoomies_site.core import registry  # noqa: PLC0415  # Django is set up by then (main)

    return Limits(
        request_timeout=registry.get("server.request_timeout").total_seconds(),
        max_body=registry.get("server.max_request_body"),
        max_per_client=registry.get("server.max_connections_per_client"),
    )


def endpoints(host: str, port: int, *, cert: str, key: str, internal_port: int | None) -> list:
    """Twisted endpoint strings: the bind (TLS when cert and key are set), and the internal
    plain-HTTP loopback listener of the controller's own clients, when given."""
    interface = quoteStringArgument(host)
    if cert and key:
        found = [
            f"ssl:port={port}:interface={interface}:privateKey={quoteStringArgument(key)}"
            f":certKey={quoteStringArgument(cert)}"
        ]
    else:
        found = [f"tcp:port={port}:interface={interface}"]
    if internal_port:
        found.append(f"tcp:port={internal_port}:interface=127.0.0.1")
    return found


class BoundedRequest(WebRequest):
    """daphne's request, with a deadline for its arrival and a cap on its body."""

    def __init__(self, channel, *args, **kwargs):
        super().__init__(channel, *args, **kwargs)
        # daphne hands the body to the ASGI app as bytes and never reads twisted's form
        # arguments; left on, twisted parses every POST's Content-Type with the email
        # package (a tenth of the event loop's time under webhook load, docs/performance.md)
        # and a multipart body of anyone's before the app has looked at the request.
        self._parsePOSTFormSubmission = False
        self._limits: Limits = channel.factory.limits
        self._started = time.monotonic()
        self._length: int | None = None
        self._received = 0
        self._refused = False
        # While a request arrives its own deadline rules, not twisted's idle timeout (which
        # would close the connection unanswered); the channel restores it after the request.
        if channel.timeOut:
            channel._savedTimeOut = channel.setTimeout(None)
        self._deadline = reactor.callLater(self._limits.budget(0), self._too_slow)

    def gotLength(self, length):
        # Called once every header is in, before the body: the earliest the proxy's
        # X-Forwarded-For can be read.
        if not self._count_forwarded_client():
            return
        if length is not None and length > self._limits.max_body:
            self._refuse(413, f"its {length}-byte body is over {self._limits.max_body} bytes")
            return
        super().gotLength(length)
        self._length = length
        self._rearm()

    def handleContentChunk(self, data):
        if self._refused:
            return
        self._received += len(data)
        if self._received > self._limits.max_body:
            self._refuse(413, f"its chunked body is over {self._limits.max_body} bytes")
            return
        super().handleContentChunk(data)
        self._rearm()

    def _rearm(self) -> None:
        """A body must keep coming (a stall of request_timeout ends it) and be complete
        within the budget for its declared length."""
        if not self._deadline.active():
            return
        now = time.monotonic()
        until = min(
            now + self._limits.request_timeout, self._started + self._limits.budget(self._length)
        )
        self._deadline.reset(max(0.0, until - now))

    def requestReceived(self, command, path, version):
        self._stop_deadline()
        if self._refused:
            return
        super().requestReceived(command, path, version)

    def _count_forwarded_client(self) -> bool:
        """Behind the proxy, once the headers are in: count this request against the client
        the proxy names, or refuse it with 429 past the cap; False when refused."""
        factory = self.channel.factory
        client = factory.forwarded_client(self)
        if client is None:
            return True
        if factory.in_flight_by_client[client] >= self._limits.max_per_client:
            self._refuse(429, f"{client} (forwarded) holds too many requests")
            return False
        factory.in_flight_by_client[client] += 1
        self.notifyFinish().addBoth(factory.forwarded_request_done, client)
        return True

    def connectionLost(self, reason):
        self._stop_deadline()
        super().connectionLost(reason)

    def _stop_deadline(self) -> None:
        if self._deadline.active():
            self._deadline.cancel()

    def _too_slow(self) -> None:
        self._refuse(408, "it did not arrive within server.request_timeout")

    def _refuse(self, status: int, why: str) -> None:
        """Answer before the application is involved, and close the connection."""
        if self._refused:
            return
        self._refused = True
        self._stop_deadline()
        peer = getattr(self.channel.transport.getPeer(), "host", "?")
        log.warning("answered %d to a request from %s: %s", status, peer, why)
        body = json.dumps({"detail": WHY[status]}).encode()  # the API's one error shape
        head = (
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n"
            % (status, REASONS[status], len(body))
        )
        transport = self.channel.transport
        transport.write(head + body)
        transport.loseConnection()
        # A client that will not read its answer is not allowed to hold the socket either.
        reactor.callLater(5, transport.abortConnection)


class BoundedHTTPFactory(HTTPFactory):
    """daphne's factory, with the idle timeout, the per-client cap and `BoundedRequest`."""

    def __init__(self, server):
        super().__init__(server)
        self.limits: Limits = server.limits
        self.internal_port: int | None = server.internal_port
        self.behind_proxy: bool = server.behind_proxy
        self.timeOut = self.limits.request_timeout
        self.open_by_client: Counter[str] = Counter()
        self.in_flight_by_client: Counter[str] = Counter()

    def counted_as(self, transport) -> str | None:
        """The address a connection counts against, or None when it is not counted: the
        internal listener's, and the proxy's when the cap counts forwarded clients."""
        if self.internal_port and getattr(transport.getHost(), "port", None) == self.internal_port:
            return None
        client = getattr(transport.getPeer(), "host", "")
        if self.behind_proxy and client in LOOPBACK:
            return None
        return client

    def forwarded_client(self, request) -> str | None:
        """Behind the proxy: the client it names for this request (the last address of
        X-Forwarded-For, the one the proxy itself appended), else None."""
        if not self.behind_proxy:
            return None
        if getattr(self.channel_peer(request), "host", "") not in LOOPBACK:
            return None
        named = request.requestHeaders.getRawHeaders(b"x-forwarded-for") or []
        last = b",".join(named).split(b",")[-1].strip().decode("latin-1")
        return last or None

    @staticmethod
    def channel_peer(request):
        return request.channel.transport.getPeer()

    def forwarded_request_done(self, result, client: str):
        self.in_flight_by_client[client] -= 1
        if self.in_flight_by_client[client] <= 0:
            del self.in_flight_by_client[client]
        # Returning None ends the chain: a lost connection is not an error to report here.

    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = BoundedRequest
        # twisted's protocol here is a proxy for the HTTP channel: the transport calls the
        # proxy's makeConnection and connectionLost, which are wrapped.
        made, lost = protocol.makeConnection, protocol.connectionLost
        counted: list[str] = []

        def connection_made(transport):
            # The cap is applied here, not before the protocol is built: only the transport
            # tells which listener (internal or not) the connection came in on.
            made(transport)
            client = self.counted_as(transport)
            if client is None:
                return
            if self.open_by_client[client] >= self.limits.max_per_client:
                log.warning(
                    "refused a connection from %s: it holds %d already",
                    client,
                    self.open_by_client[client],
                )
                transport.abortConnection()
                return
            self.open_by_client[client] += 1
            counted.append(client)

        def connection_lost(reason):
            for client in counted:
                self.open_by_client[client] -= 1
                if self.open_by_client[client] <= 0:
                    del self.open_by_client[client]
            counted.clear()
            return lost(reason)

        protocol.makeConnection = connection_made
        protocol.connectionLost = connection_lost
        return protocol


class Server(daphne.server.Server):
    def __init__(
        self,
        *args,
        limits: Limits,
        internal_port: int | None = None,
        behind_proxy: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.internal_port = internal_port
        self.behind_proxy = behind_proxy

    async def handle_reply(self, protocol, message):
        """daphne's, plus backpressure for a streamed body: the application's next `send`
        waits while the client's socket is full. daphne alone writes whatever it is sent
        into twisted's buffer, so a client that never reads an endless response (a runner's
        log, LOG-05) would grow this process without bound; waiting here makes the stream's
        own bounded queue (fleet/logs.py) the one that fills and drops."""
        await super().handle_reply(protocol, message)
        if message.get("type") == "http.response.body" and message.get("more_body"):
            # twisted's HTTPChannel sets this while the transport has asked it to pause
            # (its buffer is over 64 KiB) and clears it when the buffer has drained.
            while getattr(getattr(protocol, "channel", None), "_waitingForTransport", False):
                state = self.connections.get(protocol)
                if state is None or state.get("disconnected"):
                    return
                await asyncio.sleep(DRAIN_POLL)


def reuse_port_endpoint(host: str, port: int) -> tuple[str, socket.socket]:
    """A listening socket on HOST:PORT with SO_REUSEPORT, so several web processes on one
    machine share the port and the kernel spreads connections between them (issue 26 item
    4), handed to twisted as daphne's `fd:` endpoint (IPv4: that parser passes no other
    address family through). The socket is returned to be kept open."""
    if ":" in host:
        raise SystemExit("zoomies server: --reuse-port takes an IPv4 bind address")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return f"fd:fileno={sock.fileno()}", sock


def serve(host: str, port: int, internal_port: int | None, *, reuse_port: bool = False) -> None:
    from zoomies_site.asgi import application  # noqa: PLC0415  # importing it sets Django up
    from zoomies_site.core import registry, transport  # noqa: PLC0415  # needs Django set up

    cert, key = registry.get("server.tls_cert"), registry.get("server.tls_key")
    for path in (cert, key):
        if path and not os.access(path, os.R_OK):
            raise SystemExit(f"zoomies server: {path} (server.tls_*) is not a readable file")
    # Secure cookies on HTTPS (served here or by a proxy in front), before the first request.
    for name, value in transport.cookie_settings(registry.current()).items():
        setattr(settings, name, value)
    limits = limits_from_registry()
    listen = endpoints(host, port, cert=cert, key=key, internal_port=internal_port)
    if reuse_port:
        if cert and key:
            raise SystemExit("zoomies server: --reuse-port serves plain HTTP; put TLS in front")
        listen[0], _kept = reuse_port_endpoint(host, port)
    # Deliveries an earlier process kept in the webhook inbox and did not record (it was
    # killed, or stopped with the database locked) are recorded now, not at the next one.
    from runners import webhook_inbox  # noqa: PLC0415  # Django is set up by now

    webhook_inbox.drain_at_start()
    # Server.run builds its HTTP factory from this module-level name; the process is ours.
    daphne.server.HTTPFactory = BoundedHTTPFactory
    log.info("serving on %s (%s)", ", ".join(listen), limits)
    Server(
        application=application,
        endpoints=listen,
        limits=limits,
        internal_port=internal_port,
        behind_proxy=bool(registry.get("server.tls_proxy")),
    ).run()
    # The reactor has stopped and every connection is closed. A sync view thread still in an
    # agent's long-poll would hold the interpreter's exit for the rest of its wait, so leave
    # now: nothing is owed to anyone any more. What the webhook inbox keeps is recorded first
    # if the database lets it within a few seconds; else by the next start.
    webhook_inbox.stop_appliers(timeout=INBOX_STOP_SECONDS)
    logging.shutdown()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zoomies_site.server")
    parser.add_argument("--bind", required=True, help="HOST:PORT")
    parser.add_argument("--internal-port", type=int, default=None)
    parser.add_argument("--reuse-port", action="store_true", help="share the port (SO_REUSEPORT)")
    options = parser.parse_args(argv)
    host, _, port = options.bind.rpartition(":")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
    serve(host.strip("[]"), int(port), options.internal_port, reuse_port=options.reuse_port)


if __name__ == "__main__":
    main()
