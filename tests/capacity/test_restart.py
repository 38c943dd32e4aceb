"""CAP-17: delivery state survives a controller killed between two tries.

A real process delivers the attempt and is SIGKILLed while it waits out the backoff after
a refused first try. A fresh step in this process finds the attempt in its rows and makes
the second try under the same event id, with the same bytes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from capacity.loop import step
from capacity.models import Attempt, AttemptState, Try
from tests.capacity.conftest import SECRET, make_pool, queue_jobs
from tests.conftest import child_database_env
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import dataclasses, os, sys, time
from datetime import timedelta
import django
django.setup()
from django.utils import timezone
from capacity.config import load
from capacity.delivery import deliver
config = dataclasses.replace(
    load(), destination_url=sys.argv[2], signing_secret=os.environ["SECRET"],
    retry_backoff=timedelta(seconds=60), timeout=timedelta(seconds=5),
)
deliver(int(sys.argv[1]), clock=timezone.now, sleep=time.sleep, config=config)
print("finished", flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_cap17_a_controller_killed_between_tries_carries_on_under_the_same_event_id(
    loop, receiver, clock
):
    clock.now = datetime.now(UTC).replace(microsecond=0)
    make_pool()
    queue_jobs(1, at=clock.now)
    step(clock.now, dispatch=lambda _id: None, config=loop.config)  # the attempt, not sent
    attempt = Attempt.objects.get()
    receiver.script = [500]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "zoomies_site.settings",
        **child_database_env(),
        "SECRET": SECRET,
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(attempt.pk), receiver.url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        receiver.wait_for(1)

        def refused_and_waiting():
            attempt.refresh_from_db()
            return attempt.state == AttemptState.PENDING and attempt.tries == 1

        wait_until(refused_and_waiting)
        assert child.poll() is None, child.stderr.read().decode()  # asleep in the backoff
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
    assert child.returncode == -signal.SIGKILL
    assert b"finished" not in child.stdout.read()

    # The restarted controller: nothing due before the backoff, the second try after it.
    loop.clock.now = attempt.next_try_at
    loop.step(seconds=-1)
    assert len(receiver.arrivals) == 1
    loop.step(seconds=1)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.tries) == (AttemptState.DELIVERED, 2)
    first, second = receiver.arrivals
    assert first.event_id == second.event_id == attempt.event_id
    assert first.body == second.body
    assert [(t.number, t.outcome, t.status_code) for t in Try.objects.order_by("number")] == [
        (1, "refused", 500),
        (2, "accepted", 204),
    ]
