"""The `zoomies` entry point (zoomies_site/cli.py) as a process runs it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_killed_by_a_fatal_signal_leaves_its_stack_in_the_log(tmp_path):
    """A controller killed by SIGBUS (a write to an immutable file's mapping, CI's store
    drill) left its log ending mid-line: the entry point turns faulthandler on first."""
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGBUS)"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from zoomies_site.cli import main; main(['zoomies', 'shell', '-c', {crash!r}])",
        ],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "ZOOMIES_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGBUS, done.stderr
    assert "Fatal Python error: Bus error" in done.stderr, done.stderr
    assert "File " in done.stderr  # a stack, not just the signal's name
