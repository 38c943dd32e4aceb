"""Non-ephemeral pools (issue 27 item 3, SCHED-15, RUN-04): a runner of such a pool gets a
registration token and the web URL of where it registers, and runs config.sh (the production
entrypoint; the fake runner does the same against the fake GitHub); it is kept across jobs and
its registration id is learnt by name once GitHub shows it online. The security finding stays.
"""

from __future__ import annotations

import pytest

from fleet.models import AgentTask
from runners import reconcile
from runners.findings import pool_findings
from runners.models import NON_EPHEMERAL_DEFAULT_GROUP, Pool, Runner, pool_errors
from runners.registrations import check_online
from tests.runners.test_pool_validation import GOOD, api  # noqa: F401  (fixture)
from tests.runners.test_reconcile import T0, fake_gh, fleet_rows, queue_jobs  # noqa: F401
from zoomies_site.core import sealing


def create_env(runner: Runner) -> dict[str, str]:
    """The environment the runner's create task carries, unsealed as its agent reads it."""
    env = AgentTask.objects.get(runner=runner).payload["env"]
    return {k: sealing.unseal_text(v.removeprefix("sealed:")) for k, v in env.items()}


def test_sched15_a_non_ephemeral_pool_is_valid_in_the_default_runner_group():
    assert pool_errors({**GOOD, "ephemeral": False}) == {}
    assert pool_errors({**GOOD, "ephemeral": False, "runner_group_id": 7}) == {
        "runner_group_id": [NON_EPHEMERAL_DEFAULT_GROUP]
    }
    assert pool_errors({**GOOD, "ephemeral": True, "runner_group_id": 7}) == {}


def test_sched15_the_api_makes_a_non_ephemeral_pool(api):  # noqa: F811
    answer = api.post("/api/v1/pools", {**GOOD, "ephemeral": False}, format="json")
    assert answer.status_code == 201, answer.content
    assert Pool.objects.get().ephemeral is False


def test_sec04_a_non_ephemeral_pool_is_a_security_finding():
    class Stored:
        name, ephemeral, dind = "zoomies-reused", False, False

    (finding,) = pool_findings([Stored()])
    assert finding.key == "config.pool_not_ephemeral:zoomies-reused"
    assert "reused" in finding.title and "next" in finding.why


def a_non_ephemeral_runner(rows) -> Runner:
    """One job queued for a pool made non-ephemeral, and the runner a pass created for it."""
    installation, pool, _host = rows
    Pool.objects.filter(pk=pool.pk).update(ephemeral=False)
    queue_jobs(installation, 1)
    reconcile.reconcile_now(now_fn=lambda: T0)
    return Runner.objects.get()


@pytest.mark.django_db(transaction=True)
def test_sched15_a_non_ephemeral_runner_gets_a_registration_token_and_the_web_url(
    fake_gh,  # noqa: F811
    fleet_rows,  # noqa: F811
):
    runner = a_non_ephemeral_runner(fleet_rows)
    assert runner.ephemeral is False and runner.github_runner_id is None
    env = {
        k: v for k, v in create_env(runner).items() if k.startswith(("ZOOMIES_RUNNER_", "ACTIONS_"))
    }
    assert set(env) == {"ZOOMIES_RUNNER_URL", "ZOOMIES_RUNNER_TOKEN", "ZOOMIES_RUNNER_NAME",
                        "ZOOMIES_RUNNER_LABELS"}  # fmt: skip
    # The web address of where it registers: the fake's host and the org, no API path.
    assert env["ZOOMIES_RUNNER_URL"] == f"{fake_gh.url}/acme"
    assert env["ZOOMIES_RUNNER_NAME"] == runner.name
    assert env["ZOOMIES_RUNNER_LABELS"].split(",")[:3] == ["self-hosted", "Linux", "X64"]
    calls = [path for _method, path, _inst in fake_gh.calls]
    assert any(p.endswith("/actions/runners/registration-token") for p in calls)
    assert not any(p.endswith("/generate-jitconfig") for p in calls)


@pytest.mark.django_db(transaction=True)
def test_sched15_its_registration_id_is_learnt_by_name_once_github_shows_it_online(
    fake_gh,  # noqa: F811
    fleet_rows,  # noqa: F811
):
    from runners.github.config import get_app  # noqa: PLC0415  # the app the fixture configured
    from runners.github.fake import runners_api  # noqa: PLC0415  # config.sh, the fake's way

    runner = a_non_ephemeral_runner(fleet_rows)
    Runner.objects.filter(pk=runner.pk).update(state="registering")
    env = create_env(runner)
    state = fake_gh.state
    with state.lock:
        runners_api.register_runner(state, {
            "url": env["ZOOMIES_RUNNER_URL"], "token": env["ZOOMIES_RUNNER_TOKEN"],
            "name": env["ZOOMIES_RUNNER_NAME"], "labels": env["ZOOMIES_RUNNER_LABELS"].split(","),
        })  # fmt: skip
        (registered,) = [r for r in state.runners.values() if r.name == runner.name]
        registered.session, registered.polling = "open", 1  # online: its listener polls
    assert check_online(T0, get_app()) == [f"{runner.name}: GitHub shows it online"]
    runner.refresh_from_db()
    assert runner.github_runner_id == registered.id and runner.state == "idle"
