"""The controller command's order at startup and shutdown (ARCH-03; issue 8, items 12, 13).

In-process: the steps the command would take are recorded instead of run, so the order is
what is asserted, with no child process started.
"""

from __future__ import annotations

import configparser
import logging
import socket
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.db import OperationalError
from django.utils import timezone

from zoomies_site import installer
from zoomies_site.core import controller_lock, dbhealth
from zoomies_site.core.models import Lease
from zoomies_site.management.commands import controller as command
from zoomies_site.ticker import Periodic, Ticker


@pytest.fixture
def lock_file(tmp_path, monkeypatch):
    path = tmp_path / "zoomies.db.lock"
    monkeypatch.setattr(controller_lock, "lock_path", lambda: path)
    return path


@pytest.fixture
def migrations(monkeypatch):
    """What the command asked `call_command` for; nothing is really migrated."""
    asked: list[str] = []
    monkeypatch.setattr(command, "call_command", lambda name, *a, **kw: asked.append(name))
    return asked


@pytest.mark.django_db
def test_arch03_a_controller_refused_by_the_file_lock_does_not_migrate(lock_file, migrations):
    fd = controller_lock.take_file_lock(lock_file)
    try:
        with pytest.raises(CommandError, match="another controller holds"):
            call_command("controller", "--no-agent", "--bind", "127.0.0.1:1")
    finally:
        controller_lock.os.close(fd)
    assert migrations == []


@pytest.mark.django_db
def test_arch03_lease03_a_controller_refused_by_the_lease_does_not_migrate(lock_file, migrations):
    Lease.objects.create(
        name=controller_lock.LEASE_NAME,
        holder="elsewhere:4242",
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    with pytest.raises(CommandError, match="held by host elsewhere, pid 4242"):
        call_command("controller", "--no-agent", "--bind", "127.0.0.1:1")
    assert migrations == []
    controller_lock.os.close(controller_lock.take_file_lock(lock_file))  # it let go of it


@pytest.mark.django_db
def test_arch03_on_a_database_without_the_lease_table_the_lease_follows_the_migrate(
    lock_file, migrations, monkeypatch
):
    """A first start: the file lock, the migrate, then the lease; then the findings."""
    steps: list[str] = []
    monkeypatch.setattr(controller_lock, "lease_table_exists", lambda: False)
    monkeypatch.setattr(command, "call_command", lambda name, *a, **kw: steps.append(name))
    taken = controller_lock.ControllerLock.take_lease

    def take_lease(self, **kwargs):
        steps.append("lease")
        return taken(self, **kwargs)

    def findings(**kwargs):
        steps.append("findings")
        raise CommandError("stop here")

    monkeypatch.setattr(controller_lock.ControllerLock, "take_lease", take_lease)
    monkeypatch.setattr(command, "config_findings", findings)
    with pytest.raises(CommandError, match="stop here"):
        call_command("controller", "--no-agent", "--bind", "127.0.0.1:1")
    assert steps == ["migrate", "lease", "findings"]
    assert Lease.objects.get(name=controller_lock.LEASE_NAME).holder == ""  # released


class Stoppable:
    def __init__(self, name: str, order: list[str]):
        self.name, self.order, self.returncode = name, order, None

    def stop(self):
        self.order.append(self.name)

    # The subprocess.Popen surface _stop_child uses.
    def poll(self):
        return self.returncode

    def terminate(self):
        self.order.append(self.name)
        self.returncode = 0

    def wait(self, timeout=None):
        return self.returncode


def test_shutdown_stops_the_agent_then_the_workers_then_the_web_server_and_says_so(caplog):
    """Issue 8 item 13: the agent's last reports need the web server still up."""
    order: list[str] = []
    caplog.set_level(logging.INFO, logger="zoomies.controller")
    command.Command()._shutdown(
        agent=Stoppable("agent", order),
        workers=Stoppable("workers", order),
        web=Stoppable("web", order),
        sandbox=None,
    )
    assert order == ["agent", "workers", "web"]
    said = [r.getMessage() for r in caplog.records if r.name == "zoomies.controller"]
    assert said == [
        "stopping: the embedded agent",
        "stopping: the workers",
        "stopping: the web server",
        "stopped",
    ]


@pytest.mark.django_db
def test_the_sandbox_is_configured_before_the_findings_are_made(lock_file, migrations, monkeypatch):
    """Issue 8 item 11: the sandbox's own App and webhook secret count as configured, so its
    startup shows neither the "no GitHub App" nor the "no webhook secret" warning."""
    seen: list[set[str]] = []

    def findings(**kwargs):
        seen.append({f.key for f in command.config_findings_real(**kwargs)})
        raise CommandError("stop here")

    monkeypatch.setattr(command, "config_findings_real", command.config_findings, raising=False)
    monkeypatch.setattr(command, "config_findings", findings)
    saved = dict(command.os.environ)
    try:
        with pytest.raises(CommandError, match="stop here"):
            call_command("controller", "--no-agent", "--sandbox", "--bind", "127.0.0.1:1")
    finally:
        command.os.environ.clear()
        command.os.environ.update(saved)
    (keys,) = seen
    assert not keys & {"config.github_app_not_configured", "config.no_webhook_secret"}


@pytest.mark.django_db
def test_cap02_a_controller_given_a_weak_signing_secret_does_not_start(
    lock_file, migrations, monkeypatch, registry_defaults
):
    """CAP-02: a short or low-entropy capacity signing secret stops the start, unquoted,
    before any child process (the findings come before the web server and the workers)."""
    spawned: list[object] = []
    monkeypatch.setattr(command.Command, "_spawn_workers", lambda self, *a, **kw: spawned.append(a))
    monkeypatch.setattr(command.Command, "_spawn_web", lambda self, *a, **kw: spawned.append(a))
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_DESTINATION_URL", "https://scaler.example/hook")
    monkeypatch.setenv("ZOOMIES_CAPACITY_DEMAND_SIGNING_SECRET", "hunter2hunter2")
    with pytest.raises(CommandError, match="capacity") as refused:
        call_command("controller", "--no-agent", "--bind", "127.0.0.1:1")
    assert "hunter2" not in str(refused.value)
    assert spawned == []
    with pytest.raises(SystemCheckError, match="capacity"):  # manage.py check says it too
        call_command("check")


@pytest.mark.django_db(transaction=True)  # the loop reads the registry from its own thread
def test_store_the_write_probe_says_degraded_while_a_ticker_round_waits_on_the_database(
    registry_defaults, monkeypatch
):
    """Issue 11 items 5 and 9: under another process's write lock each enqueue of a ticker
    round (django-q2's broker is the database) waits out SQLite's busy timeout, 20 s a task.
    The lease renewal, which is the write probe, must not wait behind that round: the
    controller says degraded while the round is still stuck (it used to say ok all through
    a 45 s lock, seen in tests/e2e/test_drills_webhook.py)."""
    registry_defaults.set("controller.lease_renew", "1s")
    stuck, let_go = threading.Event(), threading.Event()

    def enqueue_behind_the_lock(now):
        stuck.set()
        let_go.wait(30)

    def renew_under_the_lock(**kwargs):
        raise OperationalError("database is locked")

    ticker = Ticker(
        jobs=[Periodic("reconcile", lambda: timedelta(seconds=1), enqueue_behind_the_lock)]
    )
    monkeypatch.setattr(command, "default_ticker", lambda started_at: ticker)
    monkeypatch.setattr(controller_lock, "renew_lease", renew_under_the_lock)
    controller = command.Command()
    controller.stopping = threading.Event()
    loop = threading.Thread(target=controller._loop, args=(SimpleNamespace(holder="here:1"), []))
    loop.start()
    try:
        assert stuck.wait(10)
        deadline = time.monotonic() + 10
        while dbhealth.read() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stuck.is_set() and not let_go.is_set()
        assert (dbhealth.read() or {}).get("error") == "database is locked"
    finally:
        controller.stopping.set()
        let_go.set()
        loop.join(30)
    assert not loop.is_alive()


def test_a_start_refused_during_an_outage_stops_the_web_server_it_started(
    registry_defaults, monkeypatch
):
    """Issue 11 item 5: during a startup outage the web server runs so /healthz can say
    degraded. If the start then ends (here the lease turns out to be held elsewhere), that
    web server is stopped too, not left serving beside a controller that gave up."""
    order: list[str] = []
    web = Stoppable("web", order)
    steps = iter([OperationalError("database is locked"), CommandError("held elsewhere")])

    def database_steps(self, lock, takeover):
        raise next(steps)

    monkeypatch.setattr(command.Command, "_database_steps", database_steps)
    monkeypatch.setattr(command.Command, "_wait_ready", lambda self, url, children: None)
    monkeypatch.setattr(command, "STARTUP_RETRY_SECONDS", 0.01)
    controller = command.Command()
    controller.stopping = threading.Event()
    try:
        with pytest.raises(CommandError, match="held elsewhere"):
            controller._open_database(
                SimpleNamespace(leased=False), False, lambda: web, "http://127.0.0.1:1"
            )
    finally:
        dbhealth.clear()
    assert order == ["web"]
    assert web.returncode == 0


def test_the_shipped_systemd_unit_signals_the_controller_alone_and_restarts_it():
    """Issue 21 item 2: systemd's default KillMode (control-group) sends SIGTERM to every
    process of the unit at once, which breaks the controller's stop order; the unit the
    README promises says `mixed` (SIGTERM to the main process, SIGKILL to what is left after
    the timeout), restarts on failure, and names the data directory and environment file.
    The shipped file is install's template (issue 26 item 1): read as install writes it."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read_string(installer.render_unit(installer.Layout(), installer.Program.this_one()))
    service = unit["Service"]
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    assert service["ExecStart"].endswith("manage.py controller")
    assert service["EnvironmentFile"].lstrip("-").startswith("/etc/")
    assert service["Environment"] == "ZOOMIES_DATA_DIR=/var/lib/zoomies"
    assert service["StateDirectory"] == "zoomies"  # /var/lib/zoomies, owned by User=
    stop_budget = 2 * command.CHILD_STOP_SECONDS  # the workers, then the web server
    assert int(service["TimeoutStopSec"]) > stop_budget


@pytest.mark.django_db
def test_a_controller_whose_address_is_taken_says_so_before_it_starts_anything(
    lock_file, monkeypatch
):
    """Issue 28's CI failure: daphne's listen failure is one log line in the web server's
    child, which then exits 0 and the controller said only that; with a slow start another
    process answering on that port could even pass for it. The taken address is named, and
    no web server child is forked."""
    forked: list[str] = []
    monkeypatch.setattr(command.Command, "_fork", lambda self, name, *a: forked.append(name))
    monkeypatch.setattr(command.Command, "_database_steps", lambda self, lock, takeover: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=rf"cannot serve on 127\.0\.0\.1:{port}: .*in use"):
            call_command("controller", "--no-agent", "--bind", f"127.0.0.1:{port}")
    assert forked == []


def test_a_free_address_passes_the_bind_check_and_is_left_free():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command.refuse_bind_in_use("127.0.0.1", port)
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))  # the check held nothing
    with pytest.raises(CommandError, match="cannot serve on no-such-host.invalid:80"):
        command.refuse_bind_in_use("no-such-host.invalid", 80)
