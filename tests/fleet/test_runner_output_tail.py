"""The controller keeps a finished runner's output tail for the failed retention (issue 8
item 14 for a failed runner, issue 9 for one that exited cleanly).

The agent's end report carries it (fleet/protocol/ `output_tail`); the runner's row keeps
it, the API's runner detail and the admin's runner page show it, and it goes with the row.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from accounts.tokens import create_api_token
from runners.housekeeping import housekeeping_step
from runners.models import Runner
from tests.fleet.conftest import join, later, make_runner

pytestmark = pytest.mark.usefixtures("registry_defaults")

TAIL = "line 1\nline 2\nFATAL: cannot reach GitHub\n"


def report(agent_api, token: str, *reports: dict) -> dict:
    answer = agent_api.post("reports", {"reports": list(reports)}, token=token)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.django_db(transaction=True)
def test_run15_a_failed_runners_output_tail_is_kept_shown_and_goes_with_it(
    agent_api, client, admin
):
    host, token = join("h1")
    runner = make_runner(host, "idle")
    other = make_runner(host, "idle")
    report(
        agent_api, token,
        {"runner_id": runner.pk, "state": "failed", "phase": "exited", "exit_code": 3,
         "message": "the runner exited with code 3; the end of its output is kept with the runner",
         "output_tail": TAIL},
        # A tail never replaces the one a runner that already ended keeps.
        {"runner_id": other.pk, "state": "removed", "phase": "exited", "exit_code": 0},
    )  # fmt: skip
    report(
        agent_api, token,
        {"runner_id": other.pk, "state": "removed", "phase": "exited", "exit_code": 0,
         "output_tail": "too late"},
    )  # fmt: skip
    runner.refresh_from_db()
    other.refresh_from_db()
    assert (runner.state, runner.output_tail) == ("failed", TAIL)
    assert other.output_tail == ""

    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _row, secret = create_api_token(user=user, name="r", scopes=["fleet:read"], actor="test")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    listed = {r["id"]: r for r in api.get("/api/v1/runners").json()["results"]}
    assert listed[runner.pk]["has_output_tail"] is True
    assert "output_tail" not in listed[runner.pk]  # the list stays light
    detail = api.get(f"/api/v1/runners/{runner.pk}").json()
    assert detail["output_tail"] == TAIL and detail["exit_code"] == 3
    assert api.get("/api/v1/runners/999999").status_code == 404

    client.force_login(admin)
    page = client.get(f"/admin/runners/runner/{runner.pk}/change/").content.decode()
    assert "FATAL: cannot reach GitHub" in page

    # The failed retention over, the row (and its tail) goes: RUN-10.
    Runner.objects.filter(pk=runner.pk).update(finished_at=later(0))
    housekeeping_step(later(0) + timedelta(minutes=11))
    assert api.get(f"/api/v1/runners/{runner.pk}").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_log06_a_clean_exits_output_tail_is_kept_shown_and_reaped_after_the_retention(agent_api):
    """LOG-06, RUN-19: a runner that exited 0 keeps the end of its output on its removed row
    for the failed retention (its workload and log are deleted meanwhile); then the row is
    reaped."""
    host, token = join("h1")
    runner = make_runner(host, "idle")
    clean = "job 7 finished: success\n"
    report(
        agent_api, token,
        {"runner_id": runner.pk, "state": "removed", "phase": "exited", "exit_code": 0,
         "message": "the runner exited with code 0", "output_tail": clean},
    )  # fmt: skip
    runner.refresh_from_db()
    assert (runner.state, runner.output_tail) == ("removed", clean)

    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _row, secret = create_api_token(user=user, name="r", scopes=["fleet:read"], actor="test")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get(f"/api/v1/runners/{runner.pk}").json()["output_tail"] == clean

    Runner.objects.filter(pk=runner.pk).update(finished_at=later(0))
    housekeeping_step(later(0) + timedelta(minutes=5))
    assert api.get(f"/api/v1/runners/{runner.pk}").json()["has_output_tail"] is True
    housekeeping_step(later(0) + timedelta(minutes=11))
    assert api.get(f"/api/v1/runners/{runner.pk}").status_code == 404
