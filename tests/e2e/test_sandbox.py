"""`controller --sandbox`: with no GitHub App at all, a newcomer watches a job complete."""

from __future__ import annotations

import time

import pytest

from tests.e2e.harness import Controller, wait_for

pytestmark = pytest.mark.e2e


def test_arch02_the_sandbox_runs_a_job_to_completion_within_a_minute(tmp_path):
    """ARCH-02, FAKE-01, FAKE-04: the README's run command, sandboxed."""
    controller = Controller(tmp_path)
    try:
        started = time.monotonic()
        controller.start("--sandbox", "--sandbox-every", "30")
        done = wait_for(
            lambda: [j for j in controller.api("jobs") if j["status"] == "completed"],
            60,
            "a sandbox job to complete",
        )
        took = time.monotonic() - started
        assert done[0]["conclusion"] == "success"
        assert done[0]["runner_name"].startswith("zoomies-sandbox-")
        assert took < 60
        pools = controller.api("pools")
        assert [p["name"] for p in pools] == ["zoomies-sandbox"]
        print(f"sandbox: first job completed {took:.1f} s after the controller was started")
    finally:
        controller.stop()
        from tests.e2e.harness import kill_leftovers

        kill_leftovers(str(tmp_path))
