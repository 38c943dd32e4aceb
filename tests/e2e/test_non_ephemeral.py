"""A non-ephemeral pool end to end (issue 27 item 3, SCHED-15, RUN-04), on a GitHub
Enterprise Server base URL (the fake behind `/api/v3`, tests/ghes_proxy.py): the runner is
configured with a registration token at the web URL (the host, never `/api/v3`), runs two
jobs one after the other without being replaced, goes back to idle between them, and once the
pool lets it go (its idle timeout) its registration is deleted at GitHub."""

from __future__ import annotations

import pytest

from runners.github.programs import FAKE_RUNNER as FAKE_RUNNER_IMAGE
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import api_job, setup_fleet
from tests.ghes_proxy import PrefixProxy

# Over 20 s of a worker: .ci/run's slow pass runs it, after the test command.
pytestmark = [pytest.mark.e2e, pytest.mark.any_database, pytest.mark.slow]
LABELS = ["self-hosted", "kept"]


def test_sched15_run04_a_non_ephemeral_runner_takes_two_jobs_and_is_deregistered(e2e):
    controller, fake = e2e
    proxy = PrefixProxy(fake)
    try:
        controller.env["ZOOMIES_GITHUB_API_URL"] = proxy.url  # http://127.0.0.1:N/api/v3
        installation = setup_fleet(controller, fake)["acme"]
        controller.start()
        pool = controller.api("pools", method="POST", json={
            "name": "zoomies-kept", "labels": ["kept"], "backend": "process",
            "image": FAKE_RUNNER_IMAGE, "max_runners": 1, "ephemeral": False,
        })  # fmt: skip
        wait_for(lambda: controller.api("hosts"), 30, "the embedded agent to join")

        first = fake.queue_job(repo="acme/app", labels=LABELS, duration=0.5, conclusion="success")
        wait_for(lambda: fake.job(first)["status"] == "completed", 90, "the first job")
        name = fake.job(first)["runner_name"]
        (registered,) = [r for r in fake.runners(installation) if r["name"] == name]
        assert registered["ephemeral"] is False  # configured with config.sh, not a JIT config
        # The registration token was asked for through /api/v3; config.sh went to the host.
        assert any(p.endswith("/actions/runners/registration-token") for p in proxy.paths)
        assert "/_runner/register" in proxy.paths

        # RUN-04: back to idle, and the same runner takes the next job.
        row = wait_for(lambda: [r for r in controller.api("runners") if r["name"] == name
                                and r["state"] == "idle" and r["github_runner_id"]], 60,
                       "the runner back to idle with its registration id")[0]  # fmt: skip
        assert row["github_runner_id"] == registered["id"]
        second = fake.queue_job(repo="acme/app", labels=LABELS, duration=0.5, conclusion="success")
        wait_for(lambda: fake.job(second)["status"] == "completed", 90, "the second job")
        assert fake.job(second)["runner_name"] == name
        assert wait_for(lambda: (j := api_job(controller, second)) and j["status"] == "completed",
                        30, "the controller to record it")  # fmt: skip
        assert [r["name"] for r in controller.api("runners") if r["state"] != "removed"] == [name]

        # The pool lets it go: its registration deleted at GitHub first (no job may reach a
        # runner being stopped), then the runner stopped and its row removed.
        controller.api(f"pools/{pool['id']}", method="PATCH", json={"idle_timeout": "00:00:02"})
        ended = wait_for(lambda: [r for r in controller.api("runners") if r["name"] == name
                                  and r["state"] in ("removed", "failed")], 90,
                         "the runner taken away")[0]  # fmt: skip
        assert ended["state"] == "removed", ended["message"]
        assert not [r for r in fake.runners(installation) if r["name"] == name]
    finally:
        proxy.stop()
