"""The engines' teardown leaves no process behind: what names the engine's root on its
command line (Podman's conmon monitors) is killed when the engine stops (issue 21 item 1)."""

from __future__ import annotations

import subprocess
import sys

from tests.fleet.backends.conftest import _kill_left_under

SLEEP = "import time; time.sleep(300)"


def test_what_names_the_engines_root_is_killed_and_nothing_else(tmp_path):
    root = tmp_path / "zp-engine"
    root.mkdir()
    left = subprocess.Popen([sys.executable, "-c", SLEEP, f"{root}/storage/overlay/exec_pid"])
    beside = subprocess.Popen([sys.executable, "-c", SLEEP, f"{tmp_path}/zp-engine-other/x"])
    try:
        killed = _kill_left_under(root)
        assert left.pid in killed and beside.pid not in killed
        assert left.wait(timeout=10) == -9
        assert beside.poll() is None, "a root that only begins with the same name is not ours"
    finally:
        for process in (left, beside):
            process.kill()
            process.wait(timeout=10)
