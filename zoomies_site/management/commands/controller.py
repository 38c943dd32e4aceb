"""`python manage.py controller`: the whole control plane as one unit (ARCH-02, ARCH-03).

In order: migrations, the settings findings (errors stop startup), the controller lock and
lease, then the ASGI server (daphne), the django-q2 cluster, the embedded agent (over
loopback HTTP, exactly as a remote agent) and the ticker that enqueues periodic passes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from zoomies_site import controller_lock, registry
from zoomies_site.ticker import default_ticker


def _die_with_parent() -> None:
    """Runs in each child before exec: the kernel sends it SIGTERM when the controller dies,
    however it dies (SIGKILL included), so no web server or worker outlives its controller
    and keeps serving the port or working the queue."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def split_bind(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise CommandError(f"--bind must be HOST:PORT, not {bind!r}")
    return host.strip("[]"), int(port)


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
        bind = options["bind"] or registry.get("server.bind")
        host, port = split_bind(bind)
        base_url = f"http://{host if host not in ('0.0.0.0', '::') else '127.0.0.1'}:{port}"

        call_command("migrate", interactive=False, verbosity=0)  # STORE-04
        findings = registry.startup_findings()
        for finding in findings:
            self.stderr.write(f"{finding.severity}: {finding.title} — {finding.fix}")
        try:
            registry.raise_for_errors(findings)
        except registry.ConfigError as exc:
            raise CommandError(str(exc)) from exc

        try:
            lock = controller_lock.acquire(
                now=timezone.now(),
                ttl=registry.get("controller.lease_ttl"),
                takeover=options["takeover"],
            )
        except controller_lock.ControllerRefused as exc:
            raise CommandError(str(exc)) from exc

        sandbox = None
        if options["sandbox"]:
            from zoomies_site import sandbox as sandbox_mod

            sandbox = sandbox_mod.start_fake_github(
                webhook_url=f"{base_url}/webhooks/github", data_dir=Path(settings.DATA_DIR)
            )
            os.environ.update(sandbox.env)
            registry.reload()
            sandbox_mod.seed(sandbox)
            self.stdout.write(f"sandbox: fake GitHub at {sandbox.fake.url}")

        children: list[subprocess.Popen] = []
        agent = None
        try:
            children.append(self._spawn_daphne(host, port))
            children.append(self._spawn(["qcluster"]))
            self._wait_ready(base_url, children)
            self.stdout.write(self.style.SUCCESS(f"Zoomies controller ready on {base_url}"))
            if not options["no_agent"]:
                agent = self._start_agent(base_url, options["agent_capacity"])
            if sandbox is not None:
                sandbox.trickle(options["sandbox_every"])
            signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
            signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
            self._loop(lock, children)
        finally:
            if agent is not None:
                agent.stop()
            for child in children:
                if child.poll() is None:
                    child.terminate()
            for child in children:
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
            if sandbox is not None:
                sandbox.stop()
            lock.release()

    def _spawn(self, manage_args: list[str]) -> subprocess.Popen:
        manage = Path(settings.BASE_DIR) / "manage.py"
        return subprocess.Popen(
            [sys.executable, str(manage), *manage_args],
            env=os.environ.copy(),
            preexec_fn=_die_with_parent,
        )

    def _spawn_daphne(self, host: str, port: int) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                host,
                "-p",
                str(port),
                "--access-log",
                os.devnull,
                "zoomies_site.asgi:application",
            ],  # fmt: skip
            cwd=str(settings.BASE_DIR),
            env=os.environ.copy(),
            preexec_fn=_die_with_parent,
        )

    def _wait_ready(self, base_url: str, children: list[subprocess.Popen]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for child in children:
                if child.poll() is not None:
                    raise CommandError(f"{child.args[:4]} exited with {child.returncode}")
            try:
                if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise CommandError(f"the web server did not answer {base_url}/healthz within 60 s")

    def _start_agent(self, base_url: str, capacity: int):
        from fleet.embedded import start_embedded_agent

        return start_embedded_agent(
            controller_url=base_url,
            state_dir=Path(settings.DATA_DIR) / "agent",
            capacity=capacity,
        )

    def _loop(self, lock, children: list[subprocess.Popen]) -> None:
        ticker = default_ticker(timezone.now())
        renew_every = registry.get("controller.lease_renew").total_seconds()
        next_renew = time.monotonic() + renew_every
        lease_lost = False
        while not self.stopping.is_set():
            for child in children:
                if child.poll() is not None:
                    raise CommandError(f"{child.args[:4]} exited with {child.returncode}")
            ticker.step(timezone.now())
            if time.monotonic() >= next_renew:
                next_renew = time.monotonic() + renew_every
                renewed = controller_lock.renew_lease(
                    holder=lock.holder, now=timezone.now(), ttl=registry.get("controller.lease_ttl")
                )
                if not renewed and not lease_lost:
                    # LEASE-07: two schedulers are running. Say so, and keep saying so: this
                    # is not a state a process recovers from by trying again.
                    lease_lost = True
                    controller_lock.record_lease_lost(holder=lock.holder, now=timezone.now())
                if lease_lost:
                    self.stderr.write("controller.lease_lost: another controller took the lease")
            self.stopping.wait(0.5)
