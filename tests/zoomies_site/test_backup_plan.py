"""The schedule's pure decisions and the progress bar (issue 11 item 6; BAK-06)."""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.purity import impurities
from zoomies_site.backup import plan
from zoomies_site.backup.progress import Progress, watching

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def snap(copies_hours_ago, *, interval=timedelta(hours=6), keep=3, keep_days=0):
    copies = tuple(
        plan.Copy(f"zoomies-{i}", T0 - timedelta(hours=h)) for i, h in enumerate(copies_hours_ago)
    )
    return plan.Snapshot(now=T0, interval=interval, keep=keep, keep_days=keep_days, copies=copies)


def test_bak06_a_copy_is_due_from_the_newest_copys_age():
    assert plan.decide(snap([])).take
    assert plan.decide(snap([])).why == "there is no backup yet"
    assert not plan.decide(snap([5, 30])).take
    assert plan.decide(snap([6, 30])).take
    off = plan.decide(snap([], interval=timedelta(0)))
    assert not off.take and "off" in off.why and off.prune == ()


def test_bak06_retention_keeps_the_newest_n_and_none_older_than_keep_days():
    pruned = plan.retention(snap([1, 7, 13, 19, 25], keep=3))
    assert [(p.name, p.reason) for p in pruned] == [
        ("zoomies-3", "beyond the newest 3 copies"),
        ("zoomies-4", "beyond the newest 3 copies"),
    ]
    aged = plan.retention(snap([1, 30, 70], keep=10, keep_days=2))
    assert [(p.name, p.reason) for p in aged] == [("zoomies-2", "older than 2 days")]


def test_bak06_retention_never_removes_the_newest_copy_however_old():
    assert plan.retention(snap([24 * 400], keep=1, keep_days=1)) == ()
    assert [p.name for p in plan.retention(snap([24 * 400, 24 * 500], keep=1))] == ["zoomies-1"]


def test_the_plan_module_is_pure():
    """No Django, no clock, no network, no files in the decision module."""
    assert impurities(Path(plan.__file__), {"__future__", "dataclasses", "datetime"}) == []


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_only_on_a_terminal():
    piped = io.StringIO()
    bar = Progress("uploading", 4 * 1024 * 1024, piped)
    bar(1024 * 1024)
    bar.finish()
    assert piped.getvalue() == ""

    tty = Terminal()
    bar = Progress("uploading", 4 * 1024 * 1024, tty)
    for _ in range(4):
        bar(1024 * 1024)
    bar.finish()
    assert tty.getvalue().endswith("uploading [" + "#" * 30 + "] 100% 4.0/4.0 MiB\n")
    assert "\r" in tty.getvalue()


def test_bak01_the_bar_follows_a_file_another_writer_grows(tmp_path):
    """VACUUM INTO says nothing while it copies: the bar watches its target grow."""
    target = tmp_path / "copy.partial"
    tty = Terminal()
    bar = Progress("copying", 2 * 1024 * 1024, tty)
    with watching(target, bar, every=0.01):
        target.write_bytes(b"x" * 1024 * 1024)
        for _ in range(1000):  # the watcher's own tick, not a sleep-then-assert
            if bar.done == 1024 * 1024:
                break
            time.sleep(0.01)
        assert bar.done == 1024 * 1024
        with target.open("ab") as grown:
            grown.write(b"x" * 1024 * 1024)
    assert bar.done == 2 * 1024 * 1024  # the last look at the end
    bar.finish()
    assert " 50% 1.0/2.0 MiB\r" in tty.getvalue()
    assert tty.getvalue().endswith("] 100% 2.0/2.0 MiB\n")
