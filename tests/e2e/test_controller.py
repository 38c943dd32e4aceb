"""The controller command as an operator meets it: migrations at start, one per database."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

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
