"""A pool serving several installations: an idle runner stands only for its own
installation's jobs (POLL-05).

Seen in the rate-limit e2e test: while one installation was rate limited, a second runner
was registered in the other one for a job the first runner had already taken. After the
reset that spare runner, idle in the wrong organisation, counted as supply for the limited
installation's job, and the job waited until the runner's idle timeout.
"""

from __future__ import annotations

from dataclasses import replace

from runners.scheduler import decide
from tests.runners.scheduler.builders import host, job, pool, runner, snapshot


def idle_at(installation_id: int | None):
    return replace(runner(state="idle"), installation_id=installation_id)


def test_poll05_an_idle_runner_of_another_installation_does_not_stand_for_a_job():
    snap = snapshot(
        pools=(pool(),), hosts=(host(),), runners=(idle_at(2),), queued=(job(installation_id=1),),
    )  # fmt: skip
    plan = decide(snap)
    assert len(plan.creates) == 1
    assert "1 job queued" in plan.creates[0].reason


def test_poll05_an_idle_runner_of_the_same_installation_does():
    snap = snapshot(
        pools=(pool(),), hosts=(host(),), runners=(idle_at(1),), queued=(job(installation_id=1),),
    )  # fmt: skip
    assert decide(snap).creates == ()


def test_poll05_each_installation_is_served_by_its_own_and_unknown_ones_match_any():
    snap = snapshot(
        pools=(pool(),),
        hosts=(host(capacity=16),),
        runners=(idle_at(1), idle_at(2), idle_at(2), idle_at(None)),
        queued=(
            job(installation_id=1), job(installation_id=1), job(installation_id=1),
            job(installation_id=2), job(installation_id=None),
        ),
    )  # fmt: skip
    # inst 1: 3 jobs, 1 own runner -> 2 uncovered; the runner of no known installation
    # takes one of them. inst 2: 1 job, 2 runners -> 1 spare, which takes the job of no
    # known installation. So 1 create.
    assert len(decide(snap).creates) == 1


def test_poll05_spare_runners_of_any_installation_count_toward_warm():
    snap = snapshot(pools=(pool(warm=2),), hosts=(host(),), runners=(idle_at(1), idle_at(2)))
    assert decide(snap).creates == ()
