"""`python manage.py controller`: the whole control plane as one unit (ARCH-02, ARCH-03).

In order: the controller lock (the file lock, and the lease row once the database has its
table), migrations, the settings findings (errors stop startup), then the web server
(`zoomies_site.server`, daphne) and the django-q2 cluster, each forked from this process
with the project already imported (zoomies_site/core/forked.py), the embedded agent (over
loopback HTTP, exactly as a remote agent) and the ticker that enqueues periodic passes.

It stops in the reverse order, and says so: the embedded agent first, while the web server
can still take its last reports, then the workers, then the web server.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection
from django.utils import timezone

from zoomies_site import sandbox as sandbox_mod
from zoomies_site.core import controller_lock, dbhealth, environment, metrics, registry, wakebus
from zoomies_site.core.forked import ForkedChild, MetricsNotShared
from zoomies_site.embedded_agent import embedded_host_name, start_embedded_agent
from zoomies_site.problems import config_findings
from zoomies_site.recovery import DeadGeneration, recover_after_restart
from zoomies_site.thread_cluster import InProcessCluster
from zoomies_site.ticker import default_ticker

log = logging.getLogger("zoomies.controller")


def split_bind(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise CommandError(f"--bind must be HOST:PORT, not {bind!r}")
    return host.strip("[]"), int(port)


def bind_in_use(given: str | None) -> tuple[str, int]:
    """The address to serve on: `--bind` when given, else `server.bind`. A `--bind` is put
    in this process's environment as ZOOMIES_SERVER_BIND before any child starts, so every
    reader of `server.bind` (the Settings page, in the web child) shows the address in use
    rather than the default (issue 21 item 14)."""
    if not given:
        return split_bind(registry.get("server.bind"))
    host, port = split_bind(given)
    os.environ.update({registry.ENTRIES["server.bind"].env: given})
    registry.reload()
    return host, port


def internal_port(data_dir: Path, *, avoid: int | None = None) -> int:
    """The loopback port the web server also listens on, in plain HTTP: the embedded agent
    and the readiness check use it (the bind may speak TLS for a public name, and its
    connections count against the per-client cap). Chosen once per data directory and kept,
    since the embedded agent's credentials are for one controller URL."""
    path = data_dir / "internal-port"
    try:
        port = int(path.read_text())
        if port == avoid:  # the operator's bind took it since: choose another
            raise ValueError(port)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
        return port
    except (OSError, ValueError):
        pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{port}\n")
    return port


def refuse_bind_in_use(host: str, port: int) -> None:
    """CommandError naming the address when it cannot be served on. The web server's own
    listen failure is one line in its log, and the controller would only see it exit."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise CommandError(f"cannot serve on {host}:{port}: {exc}") from exc
    with socket.socket(family, kind, proto) as sock:
        # As twisted binds: a predecessor's connections in TIME_WAIT are no obstacle.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise CommandError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc}; is another process "
                "listening there? Stop it, or choose another address (--bind, server.bind)"
            ) from exc


# How long a startup that found the database unwritable waits before it tries again.
STARTUP_RETRY_SECONDS = 2.0
# How long a child has to stop after its SIGTERM before it is killed.
CHILD_STOP_SECONDS = 15
# How long a stopping controller waits for a renewal in progress: past SQLite's 20 s busy
# timeout (zoomies_site/settings.py), which a renewal under a write lock waits out.
RENEWAL_JOIN_SECONDS = 30.0


def check_configuration(stderr) -> None:
    """The settings findings, each written out; an error among them stops the command."""
    findings = config_findings(fresh=True)
    for finding in findings:
        stderr.write(f"{finding.severity}: {finding.title} — {finding.fix}")
    try:
        registry.raise_for_errors(findings)
    except registry.ConfigError as exc:
        raise CommandError(str(exc)) from exc


def answered(response: httpx.Response) -> bool:
    """The web server is up: /healthz answers ok, or degraded (the database takes no writes
    this moment, which the controller rides out rather than exits on)."""
    if response.status_code == 200:
        return True
    try:
        return response.status_code == 503 and response.json().get("status") == "degraded"
    except ValueError:
        return False


class Command(BaseCommand):
    help = "Run the Zoomies controller: web server, workers, embedded agent and loops."

    def add_arguments(self, parser):
        parser.add_argument("--bind", help="HOST:PORT to serve on (default: server.bind)")
        parser.add_argument("--sandbox", action="store_true", help="run beside a fake GitHub")
        parser.add_argument("--sandbox-every", type=float, default=20.0, help="seconds per job")
        parser.add_argument("--takeover", action="store_true", help="take a lease held elsewhere")
        parser.add_argument("--no-agent", action="store_true", help="run no embedded agent")
        parser.add_argument("--agent-capacity", type=int, default=4, help="embedded agent slots")

    def handle(self, *args, **options):
        self.stopping = threading.Event()
        host, port = bind_in_use(options["bind"])

        # ARCH-03: the lock before anything else; a refused controller must not migrate.
        lock = self.lock = self._lock()
        web = workers = agent = sandbox = None
        try:
            tls = bool(registry.get("server.tls_cert") and registry.get("server.tls_key"))
            scheme, public_host = ("https" if tls else "http"), host
            # The controller's own clients (the embedded agent, the readiness check) use a
            # loopback listener of their own, which the per-client cap does not count: slow
            # clients on the bind cannot lock them out (issue 21 item 12).
            inner = internal_port(Path(settings.DATA_DIR), avoid=port)
            base_url = f"http://127.0.0.1:{inner}"
            # The children count into files here and /metrics adds them up; a restart clears
            # the dead processes' files so counts start again from zero.
            metrics_dir = Path(settings.DATA_DIR) / "prometheus"
            metrics.clear_multiproc_dir(metrics_dir)
            startup_dir = environment.read(metrics.MULTIPROC_ENV)
            os.environ.update({metrics.MULTIPROC_ENV: str(metrics_dir)})
            # manage.py's directory for this process's counts until now: its open files stay
            # valid unlinked, and a killed controller leaves no directory behind in /tmp.
            metrics.remove_startup_dir(startup_dir)

            signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
            signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
            dbhealth.clear()  # a marker a killed predecessor left says nothing now
            wakebus.sweep_stale()  # the wake sockets of killed predecessors
            web = self._open_database(
                lock, options["takeover"], lambda: self._spawn_web(host, port, inner), base_url
            )
            if self.stopping.is_set():
                return
            if web is not None:
                # A web server started during the outage is replaced: SQLite opens a file's
                # shared-memory index once per process, and one first opened read-only stays
                # read-only for every connection of that process until they all close.
                self._stop_child(web)
                web = None

            if options["sandbox"]:
                # Before the findings: the sandbox's own App and secret are configuration.
                sandbox = self._start_sandbox(base_url)
            check_configuration(self.stderr)
            if sandbox is not None:
                sandbox_mod.seed(sandbox)

            web = web or self._spawn_web(host, port, inner)
            workers = self._spawn_workers()
            children = [web, workers]
            self._wait_ready(base_url, children)
            self.stdout.write(
                self.style.SUCCESS(f"Zoomies controller ready on {scheme}://{public_host}:{port}")
            )
            if not options["no_agent"]:
                agent = self._start_agent(base_url, options["agent_capacity"])
            if sandbox is not None:
                sandbox.trickle(options["sandbox_every"])
            self._loop(lock, children)
        finally:
            self._shutdown(agent=agent, workers=workers, web=web, sandbox=sandbox)
            lock.release()

    def _lock(self) -> controller_lock.ControllerLock:
        """The file lock; the lease row is the database's, taken in `_open_database`."""
        try:
            return controller_lock.acquire(
                now=timezone.now(), ttl=registry.get("controller.lease_ttl"), lease=False
            )
        except controller_lock.ControllerRefused as exc:
            raise CommandError(str(exc)) from exc

    def _open_database(
        self,
        lock: controller_lock.ControllerLock,
        takeover: bool,
        start_web: Callable[[], ForkedChild],
        base_url: str,
    ) -> ForkedChild | None:
        """The lease, the migrations and the recovery, tried again for as long as the
        database takes no writes (issue 11 item 5, at startup as in the loop): a write lock
        another process holds or a read-only file is a degraded state, not an exit. The
        marker file says so, and the web server starts meanwhile, so /healthz and the
        problems list say it too; the rest starts once the database answers. Returns that
        web server, if one was started."""
        web = None
        try:
            while not self.stopping.is_set():
                try:
                    self._database_steps(lock, takeover)
                except DatabaseError as exc:
                    if dbhealth.read() is None:
                        log.error("database degraded at startup: %s; trying again", exc)
                        self.stderr.write(f"database degraded: {exc}; the controller waits for it")
                    dbhealth.mark_degraded(error=str(exc), now=timezone.now())
                    connection.close()  # the next try on a fresh connection, as the probe does
                else:
                    if dbhealth.clear():
                        log.warning("database writable again: the controller starts")
                    return web
                if web is None:
                    web = start_web()
                    self._wait_ready(base_url, [web])
                elif web.poll() is not None:
                    raise CommandError(f"{web.args[:4]} exited with {web.returncode}")
                self.stopping.wait(STARTUP_RETRY_SECONDS)
        except BaseException:
            # A refusal or a failure here ends the start: the web server started for the
            # outage is the caller's to stop only once returned, so it is stopped here.
            if web is not None:
                self._stop_child(web)
            raise
        return web

    def _database_steps(self, lock: controller_lock.ControllerLock, takeover: bool) -> None:
        """ARCH-03: a database that has the lease table gives the lease before it migrates."""
        if not lock.leased and controller_lock.lease_table_exists():
            self._take_lease(lock, takeover)
        call_command("migrate", interactive=False, verbosity=0)  # STORE-04
        if not lock.leased:
            self._take_lease(lock, takeover)
        self._recover()

    def _take_lease(self, lock: controller_lock.ControllerLock, takeover: bool) -> None:
        """LEASE-03; ControllerRefused (another host holds it) is an exit, not an outage."""
        try:
            lock.take_lease(
                now=timezone.now(), ttl=registry.get("controller.lease_ttl"), takeover=takeover
            )
        except controller_lock.ControllerRefused as exc:
            raise CommandError(str(exc)) from exc

    def _recover(self) -> None:
        """Issue 11 item 3: what the killed predecessor held is freed now, not at expiry;
        what its still-dying processes hold is freed by the loop as each dies (item 17)."""

        for line in recover_after_restart(now=timezone.now(), embedded_host=embedded_host_name()):
            self.stdout.write(f"recovery: {line}")
        self.dead_generation = DeadGeneration()

    def _start_sandbox(self, base_url: str):
        sandbox = sandbox_mod.start_fake_github(
            webhook_url=f"{base_url}/webhooks/github", data_dir=Path(settings.DATA_DIR)
        )
        os.environ.update(sandbox.env)
        registry.reload()
        self.stdout.write(f"sandbox: fake GitHub at {sandbox.fake.url}")
        return sandbox

    def _shutdown(self, *, agent, workers, web, sandbox) -> None:
        """The agent first, while the web server still takes its last reports (issue 8 #13)."""
        if agent is not None:
            log.info("stopping: the embedded agent")
            agent.stop()
        if workers is not None:
            log.info("stopping: the workers")
            self._stop_child(workers)
        if web is not None:
            log.info("stopping: the web server")
            self._stop_child(web)
        if sandbox is not None:
            sandbox.stop()
        if web is not None:
            log.info("stopped")

    @staticmethod
    def _stop_child(child: ForkedChild | InProcessCluster) -> None:
        if child.poll() is None:
            child.terminate()
        try:
            child.wait(timeout=CHILD_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning(
                "the %s did not stop within %d s: killed", child.args[0], CHILD_STOP_SECONDS
            )
            child.kill()
            child.wait(timeout=5)

    def _spawn_workers(self) -> ForkedChild | InProcessCluster:
        if settings.TASK_CLUSTER == "threads":
            # Threads of this process: a process of their own cost 20 MB or more of memory
            # each (docs/performance.md "Memory"), and the tasks mostly wait on I/O.
            return InProcessCluster()

        def cluster() -> None:
            call_command("qcluster")
            # The cluster runs in its sentinel process; a `qcluster` process waits for it in
            # the interpreter's exit, which a forked child leaves without (os._exit).
            for process in multiprocessing.active_children():
                process.join()

        return self._fork("django-q2 cluster", cluster, "zoomies-workers")

    def _spawn_web(self, host: str, port: int, internal: int | None) -> ForkedChild:
        refuse_bind_in_use(host, port)  # the internal port was chosen free (internal_port)
        argv = ["--bind", f"{host}:{port}"]
        if internal is not None:
            argv += ["--internal-port", str(internal)]

        def serve() -> None:
            from zoomies_site import server  # noqa: PLC0415  # daphne's reactor: the child's own

            server.main(argv)

        return self._fork("web server", serve, "zoomies-web")

    def _fork(self, name: str, run: Callable[[], object], process_name: str) -> ForkedChild:
        """Forked, not exec'd: the child starts with the project imported and Django set
        up (zoomies_site/core/forked.py); it must not keep the controller's file lock."""
        try:
            return ForkedChild(name, run, close_in_child=[self.lock.fd], process_name=process_name)
        except MetricsNotShared as exc:
            raise CommandError(str(exc)) from exc

    def _wait_ready(self, base_url: str, children: list[ForkedChild | InProcessCluster]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for child in children:
                if child.poll() is not None:
                    raise CommandError(f"{child.args[:4]} exited with {child.returncode}")
            try:
                if answered(httpx.get(f"{base_url}/healthz", timeout=2)):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise CommandError(f"the web server did not answer {base_url}/healthz within 60 s")

    def _start_agent(self, base_url: str, capacity: int):
        return start_embedded_agent(
            controller_url=base_url,
            state_dir=Path(settings.DATA_DIR) / "agent",
            capacity=capacity,
        )

    def _renew(self, lock) -> bool | None:
        """Renew the lease, which is also the write probe; None when the database took no
        write. Issue 11 item 5: a stalled or read-only database is a degraded state (marker
        file, /healthz 503, a problem), not an exit, and it ends with the first write that
        goes through."""
        try:
            renewed = controller_lock.renew_lease(
                holder=lock.holder, now=timezone.now(), ttl=registry.get("controller.lease_ttl")
            )
        except DatabaseError as exc:
            if dbhealth.read() is None:
                log.error("database degraded: %s", exc)
            dbhealth.mark_degraded(error=str(exc), now=timezone.now())
            return None
        finally:
            # A fresh connection for each probe: one opened before the file turned read-only
            # would keep writing through it and hide the problem from everyone else.
            connection.close()
        if dbhealth.clear():
            log.warning("database writable again: the controller carries on")
        return renewed

    def _loop(self, lock, children: list[ForkedChild | InProcessCluster]) -> None:
        ticker = default_ticker(timezone.now())
        renew_every = registry.get("controller.lease_renew").total_seconds()
        # The write probe runs on a thread of its own: a ticker round enqueues through the
        # database (django-q2's ORM broker), and under another process's write lock each
        # enqueue waits out SQLite's busy timeout, 20 s a task. Behind such a round the probe
        # never ran, and /healthz said ok all through a 45 s lock.
        done = threading.Event()
        renewal = threading.Thread(
            target=self._renew_loop, args=(lock, renew_every, done), name="lease-renewal",
            daemon=True,
        )  # fmt: skip
        renewal.start()
        next_close = time.monotonic() + renew_every
        dead_generation = getattr(self, "dead_generation", None)
        waits_until = time.monotonic() + registry.get("controller.lease_ttl").total_seconds()
        try:
            while not self.stopping.is_set():
                for child in children:
                    if child.poll() is not None:
                        raise CommandError(f"{child.args[:4]} exited with {child.returncode}")
                if dead_generation is not None:
                    dead_generation = self._free_dead_generation(dead_generation, waits_until)
                ticker.step(timezone.now())
                if time.monotonic() >= next_close:
                    # The ticker's connection, afresh as often as the probe's: one broken by
                    # a database restart is never reopened by Django outside a request.
                    next_close = time.monotonic() + renew_every
                    connection.close()
                self.stopping.wait(0.5)
        finally:
            done.set()
            # A renewal after the lease is released below would find it gone (LEASE-07).
            renewal.join(RENEWAL_JOIN_SECONDS)

    @staticmethod
    def _free_dead_generation(
        dead_generation: DeadGeneration, waits_until: float
    ) -> DeadGeneration | None:
        """One step of freeing what the killed predecessor's dying processes held; None once
        nothing is left to wait for (or the leases have expired by themselves)."""
        try:
            more = dead_generation.step()
        except DatabaseError as exc:  # a degraded database: the next round tries again
            log.debug("recovery step skipped: %s", exc)
            more = True
        if more and time.monotonic() < waits_until:
            return dead_generation
        return None

    def _renew_loop(self, lock, renew_every: float, done: threading.Event) -> None:
        """The lease renewal and write probe, every `controller.lease_renew` until `done`."""
        lease_lost = False
        while not done.wait(renew_every):
            try:
                renewed = self._renew(lock)
                if renewed is False and not lease_lost:
                    # LEASE-07: two schedulers are running. Say so, and keep saying so: this
                    # is not a state a process recovers from by trying again.
                    lease_lost = True
                    controller_lock.record_lease_lost(holder=lock.holder, now=timezone.now())
            except Exception:  # the probe must outlive a fault of ours, or nothing says degraded
                log.exception("lease renewal failed")
            if lease_lost:
                self.stderr.write("controller.lease_lost: another controller took the lease")
