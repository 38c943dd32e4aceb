"""The run's own check that no process outlives it (issue 21 item 1, tests/leftovers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LEAKY = """
import subprocess, sys
from pathlib import Path

def test_it_starts_a_process_and_forgets_it(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path({pidfile!r}).write_text(str(child.pid))
"""

TIDY = """
import subprocess, sys

def test_it_starts_a_process_and_waits_for_it():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def run_pytest(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.leftovers", "-p", "no:django",
         "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(tmp_path),
         "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_inner.py")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "ZOOMIES_TEST_LEFTOVER_GRACE": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_run_that_leaves_a_process_behind_fails_and_kills_it(tmp_path):
    pidfile = tmp_path / "leaked.pid"
    done = run_pytest(tmp_path, LEAKY.format(pidfile=str(pidfile)))
    leaked = int(pidfile.read_text())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout  # the test itself passed: the run's check failed it
    assert f"{leaked}: " in done.stdout and "processes left behind" in done.stdout
    deadline = time.monotonic() + 10
    while alive(leaked):
        assert time.monotonic() < deadline, "the leaked process was not killed"
        time.sleep(0.1)


def test_a_tidy_run_passes(tmp_path):
    done = run_pytest(tmp_path, TIDY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left behind" not in done.stdout
