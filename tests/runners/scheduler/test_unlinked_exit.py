"""A runner that ran a job we have not heard of yet stands for that job for a grace."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from runners.scheduler import decide
from tests.runners.scheduler.builders import host, jobs, pool, runner, snapshot


def clean_exit(finished_ago: timedelta):
    return replace(
        runner(state="removed", finished_ago=finished_ago, in_state=finished_ago),
        unlinked_exit=True,
    )


def test_hook03_a_fresh_unexplained_exit_holds_back_the_create_for_its_job():
    """HOOK-03: the job's completion is late; it must not get a second runner meanwhile."""
    snap = snapshot(
        pools=(pool(),), hosts=(host(),), runners=(clean_exit(timedelta(seconds=5)),),
        queued=jobs(1),
    )  # fmt: skip
    assert decide(snap).creates == ()


def test_hook03_an_unexplained_exit_stands_for_one_job_only():
    snap = snapshot(
        pools=(pool(),), hosts=(host(),), runners=(clean_exit(timedelta(seconds=5)),),
        queued=jobs(3),
    )  # fmt: skip
    assert len(decide(snap).creates) == 2


def test_hook03_after_the_grace_the_job_gets_a_runner_again():
    """If GitHub really still has the job queued, it is served once the grace is over."""
    snap = snapshot(
        pools=(pool(),), hosts=(host(),), runners=(clean_exit(timedelta(minutes=2)),),
        queued=jobs(1),
    )  # fmt: skip
    assert len(decide(snap).creates) == 1


def test_a_removed_runner_with_its_job_known_holds_nothing_back():
    snap = snapshot(
        pools=(pool(),),
        hosts=(host(),),
        runners=(runner(state="removed", finished_ago=timedelta(seconds=5)),),
        queued=jobs(1),
    )
    assert len(decide(snap).creates) == 1
