"""The controller command as an operator meets it: migrations at start, one per database."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bench._common import _stat
from tests.e2e.harness import MANAGE, ROOT, Controller, free_port

pytestmark = pytest.mark.e2e


def test_store04_migrations_are_applied_at_startup_and_recorded(tmp_path):
    """STORE-04, ARCH-03: a controller started on an empty data dir migrates it itself."""
    controller = Controller(tmp_path)
    controller.token = "not-needed"  # skip prepare(): the controller must migrate alone
    try:
        controller.start("--no-agent")
        if "ZOOMIES_DATABASE_URL" in controller.env:
            return_ok = controller.manage("showmigrations", "--plan")
            assert "[ ]" not in return_ok
            return
        with sqlite3.connect(tmp_path / "zoomies.db") as db:
            applied = {app for (app,) in db.execute("SELECT app FROM django_migrations")}
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        assert {"accounts", "runners", "fleet", "zoomies_site", "django_q"} <= applied
        assert mode == "wal"
    finally:
        controller.stop()


def test_lease01_lease04_a_second_controller_on_the_same_database_is_refused(tmp_path):
    """LEASE-01, LEASE-04: the second one exits at once and names the holder."""
    first = Controller(tmp_path)
    try:
        first.start("--no-agent")
        second = subprocess.run(
            [sys.executable, MANAGE, "controller", "--no-agent", "--bind",
             f"127.0.0.1:{free_port()}"],
            env=first.env, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode != 0
        assert "another controller holds" in second.stderr
        assert f"pid {first.process.pid}" in second.stderr
    finally:
        first.stop()


def children_of(pid: int) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and ((fields := _stat(entry)) and fields[1] == str(pid))
    ]


def open_files(pid: int) -> set[str]:
    names = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            names.add(os.readlink(fd))
        except OSError:
            continue
    return names


@pytest.mark.any_database  # what it checks is the process tree, the same on either engine
@pytest.mark.parametrize(
    ("cluster", "names"),
    [
        ("threads", {"zoomies-web"}),
        # Not the default: in .ci/run's slow pass, after the test command.
        pytest.param("processes", {"zoomies-web", "zoomies-workers"}, marks=pytest.mark.slow),
    ],
)
def test_the_web_server_and_the_workers_are_forked_and_keep_no_controller_lock(
    tmp_path, cluster, names
):
    """The controller forks its web server (and, with ZOOMIES_Q_CLUSTER=processes, its
    django-q2 cluster) with the project already imported (zoomies_site/core/forked.py),
    rather than starting more interpreters that import it all again; no child keeps the
    controller's file lock open, which would hold it past the controller's own death. By
    default the task cluster is threads of the controller (zoomies_site/thread_cluster.py):
    one child only, and the passes still run and count."""
    controller = Controller(tmp_path, env={"ZOOMIES_Q_CLUSTER": cluster})
    try:
        controller.start("--no-agent")
        parent = controller.process.pid
        cmdline = Path(f"/proc/{parent}/cmdline").read_bytes()
        children = children_of(parent)
        assert len(children) == len(names), children
        lock = (
            str(tmp_path / "zoomies.db.lock")
            if "ZOOMIES_DATABASE_URL" not in controller.env
            else str(tmp_path / "controller.lock")
        )
        assert lock in open_files(parent)
        for child in children:
            assert Path(f"/proc/{child}/cmdline").read_bytes() == cmdline  # a fork: no exec
            assert lock not in open_files(child)
        # Named for ps and top, since the command line is the controller's.
        assert {Path(f"/proc/{child}/comm").read_text().strip() for child in children} == names
        assert controller.reconcile_passes() >= 0  # /metrics answers from the forked web server
        controller.wait_reconcile_passes(1)  # and counts the workers' passes
    finally:
        controller.stop()
