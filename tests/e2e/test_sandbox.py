"""`controller --sandbox`: with no GitHub App at all, a newcomer watches a job complete."""

from __future__ import annotations

import time

import pytest

from tests.e2e.harness import Controller, kill_leftovers, wait_for

# What it tests is the sandbox a newcomer starts, the same on either database.
pytestmark = [pytest.mark.e2e, pytest.mark.any_database]


def test_arch02_fake08_the_sandbox_runs_a_job_to_completion(tmp_path):
    """ARCH-02, FAKE-01, FAKE-04: the README's run command, sandboxed. How long the first job
    takes is printed, not asserted (a loaded machine is no failure); the deadline only ends a
    wait that would never end."""
    controller = Controller(tmp_path)
    try:
        started = time.monotonic()
        controller.start("--sandbox", "--sandbox-every", "30")
        done = wait_for(
            lambda: [j for j in controller.api("jobs") if j["status"] == "completed"],
            180,
            "a sandbox job to complete",
        )
        took = time.monotonic() - started
        assert done[0]["conclusion"] == "success"
        assert done[0]["runner_name"].startswith("zoomies-sandbox-")
        pools = controller.api("pools")
        assert [p["name"] for p in pools] == ["zoomies-sandbox"]
        print(f"sandbox: first job completed {took:.1f} s after the controller was started")
    finally:
        controller.stop()
        kill_leftovers(str(tmp_path))
