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
    from zoomies_site.core import metrics  # noqa: PLC0415

    startup = Path(tempfile.mkdtemp(prefix=metrics.STARTUP_DIR_PREFIX))
    (startup / "counter_1.db").write_bytes(b"")
    operators = tmp_path / f"{metrics.STARTUP_DIR_PREFIX}theirs"  # the prefix, elsewhere
    operators.mkdir()
    metrics.remove_startup_dir(str(startup))
    metrics.remove_startup_dir(str(operators))
    metrics.remove_startup_dir(None)
    assert not startup.exists()
    assert operators.exists()


def _pid_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_grandchild_dies_with_its_parent_however_the_parent_dies(shared_metrics, tmp_path):
    """Issue 21 item 1: django-q2's sentinel and workers are forks of the forked child, and a
    parent-death signal is not inherited across a fork. Here the child forks a grandchild
    that ignores SIGTERM (as django-q2's processes may, mid-start), then the child is killed:
    the grandchild must die too, not live on under init."""
    report = tmp_path / "grandchild"

    def fork_a_stubborn_grandchild() -> None:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(60)
            os._exit(0)
        report.write_text(str(pid))
        time.sleep(60)

    child = forked.ForkedChild("child", fork_a_stubborn_grandchild)
    deadline = time.monotonic() + 30
    while not report.exists() or not report.read_text():
        assert time.monotonic() < deadline, "the child never forked"
        time.sleep(0.05)
    grandchild = int(report.read_text())
    try:
        child.kill()
        assert child.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while _pid_state(grandchild) not in ("gone", "Z", "X"):
            assert time.monotonic() < deadline, f"grandchild {grandchild} outlived its parent"
            time.sleep(0.05)
    finally:
        if _pid_state(grandchild) not in ("gone", "Z", "X"):
            os.kill(grandchild, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_leaves_at_once():
    """Issue 21 item 1, the race: a parent that died between the fork and the arming of the
    signal has left its child to init, which no signal will ever stop. The check after
    arming it sees a parent that is not the one that forked, and leaves."""
    pid = os.fork()
    if pid == 0:  # the child: "forked" by a parent that is not its parent
        try:
            forked.die_with_parent(os.getppid() + 1_000_000)
        finally:
            os._exit(7)  # reached only if die_with_parent let it live on
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1


def test_each_child_leads_a_process_group_of_its_own(shared_metrics, tmp_path):
    """Issue 21 item 2: a signal to the controller's group (Ctrl-C, `kill -- -PGID`) reaches
    the controller alone, which stops its children in order."""
    report = tmp_path / "group"
    child = forked.ForkedChild("child", lambda: report.write_text(f"{os.getpgid(0)} {os.getpid()}"))
    assert child.wait(timeout=30) == 0
    group, pid = report.read_text().split()
    assert group == pid != str(os.getpgid(0))
