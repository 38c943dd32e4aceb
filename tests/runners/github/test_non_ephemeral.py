"""Non-ephemeral pools are refused until something runs config.sh for them (issue 8 item 9).

Nothing in the agent or the runner image consumes a registration token, so such a pool's
runners would never come online; the validation refuses it, a stored one gets a true finding,
and the reconcile pass spends no registration token on it.
"""

from __future__ import annotations

import pytest

from runners import reconcile
from runners.findings import pool_findings
from runners.models import NON_EPHEMERAL_UNSUPPORTED, Pool, pool_errors
from runners.states import RunnerState
from tests.runners.test_pool_validation import GOOD, api  # noqa: F401  (fixture)
from tests.runners.test_reconcile import T0, fake_gh, fleet_rows, queue_jobs  # noqa: F401


def test_sched15_the_validation_refuses_a_non_ephemeral_pool_and_says_why():
    """SCHED-15 (refused half): one validation for the admin, the API and zoomies.yaml."""
    assert pool_errors({**GOOD, "ephemeral": False}) == {"ephemeral": [NON_EPHEMERAL_UNSUPPORTED]}
    assert pool_errors({**GOOD, "ephemeral": True}) == {}
    assert "config.sh" in NON_EPHEMERAL_UNSUPPORTED


def test_sched15_the_api_answers_400_for_a_non_ephemeral_pool(api):  # noqa: F811
    answer = api.post("/api/v1/pools", {**GOOD, "ephemeral": False}, format="json")
    assert answer.status_code == 400, answer.content
    assert "config.sh" in str(answer.json()["ephemeral"])
    assert not Pool.objects.exists()


def test_sec04_a_stored_non_ephemeral_pool_is_a_true_finding():
    class Stored:
        name, ephemeral, dind = "zoomies-old", False, False

    (finding,) = pool_findings([Stored()])
    assert finding.key == "config.pool_not_ephemeral:zoomies-old"
    assert "gets no runners" in finding.title and "config.sh" in finding.why


@pytest.mark.django_db(transaction=True)
def test_sched15_a_stored_non_ephemeral_pool_gets_no_runner_and_no_token(fake_gh, fleet_rows):  # noqa: F811
    installation, pool, _host = fleet_rows
    Pool.objects.filter(pk=pool.pk).update(ephemeral=False)  # stored before the refusal
    queue_jobs(installation, 1)
    reports = reconcile.reconcile_now(now_fn=lambda: T0)
    skipped = [line for report in reports for line in report.skipped]
    assert any(NON_EPHEMERAL_UNSUPPORTED in line for line in skipped), skipped
    assert not pool.runners.exclude(state=RunnerState.REMOVED).exists()
    assert not [c for c in fake_gh.calls if c[1].endswith("/registration-token")]
