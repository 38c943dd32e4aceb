"""The controller's forked children (zoomies_site/core/forked.py): the Popen surface the
controller uses, exit codes as a process would report them, and the refusal to fork while
Prometheus keeps its counts in memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from zoomies_site.core import forked


@pytest.fixture
def shared_metrics(monkeypatch):
    """This test process counts in memory; the children below count nothing."""
    monkeypatch.setattr(forked, "metrics_shared", lambda: True)


def test_a_fork_is_refused_while_metrics_are_kept_in_memory():
    assert not forked.metrics_shared()  # pytest imported prometheus_client without the variable
    with pytest.raises(forked.MetricsNotShared, match="manage.py controller"):
        forked.ForkedChild("web server", lambda: None)


@pytest.mark.parametrize(
    ("run", "code"),
    [
        (lambda: None, 0),
        (lambda: sys.exit(3), 3),
        (lambda: sys.exit("said why"), 1),
        (lambda: 1 / 0, 1),
    ],
    ids=["returns", "exit-3", "exit-message", "raises"],
)
def test_the_exit_code_is_what_a_process_would_report(shared_metrics, run, code):
    child = forked.ForkedChild("child", run)
    assert child.wait(timeout=30) == code
    assert child.poll() == code


def test_wait_times_out_terminate_stops_and_a_reaped_child_is_not_signalled(shared_metrics):
    child = forked.ForkedChild("sleeper", lambda: time.sleep(60))
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.terminate()  # the controller's SIGTERM handler is not the child's: default, it dies
    assert child.wait(timeout=30) == -signal.SIGTERM
    child.kill()  # reaped already: no signal goes to a pid that may be someone else's now


def test_the_named_descriptors_are_closed_in_the_child_only(shared_metrics, tmp_path):
    kept = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    report = tmp_path / "report"

    def look() -> None:
        try:
            os.fstat(kept)
            report.write_text("open")
        except OSError:
            report.write_text("closed")

    try:
        assert forked.ForkedChild("child", look, close_in_child=[kept]).wait(timeout=30) == 0
        assert report.read_text() == "closed"
        os.fstat(kept)  # still the parent's
    finally:
        os.close(kept)


def test_the_startup_metrics_directory_goes_and_an_operators_stays(tmp_path):
    """manage.py's directory for a starting controller's counts is removed once the variable
    points at the data directory; a directory anyone else named is never touched."""
    from zoomies_site import metrics  # noqa: PLC0415

    startup = Path(tempfile.mkdtemp(prefix=metrics.STARTUP_DIR_PREFIX))
    (startup / "counter_1.db").write_bytes(b"")
    operators = tmp_path / f"{metrics.STARTUP_DIR_PREFIX}theirs"  # the prefix, elsewhere
    operators.mkdir()
    metrics.remove_startup_dir(str(startup))
    metrics.remove_startup_dir(str(operators))
    metrics.remove_startup_dir(None)
    assert not startup.exists()
    assert operators.exists()
