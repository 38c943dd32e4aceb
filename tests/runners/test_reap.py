"""The registration reap against the fake GitHub (POLL-08..11).

Registrations are made as the controller makes them, through the client's JIT config call;
a busy one is a registration whose runner opened its session and was handed a long job.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import AuditLog
from runners.models import Installation, Pool, Runner
from runners.poller import poll_step
from runners.reap import reap_step
from tests.runners.conftest import go_online, install, make_host, make_runner, register

LABELS = ["self-hosted", "linux"]


@pytest.fixture(autouse=True)
def _isolated(github_settings):
    return github_settings


@pytest.fixture
def clock(github_clock):
    return github_clock


@pytest.fixture
def fake(silent_github):
    return silent_github


@pytest.fixture
def app(github_app):
    return github_app


@pytest.fixture
def started(clock):
    """The process started two minutes ago, so the first reap is due."""
    return clock.now() - timedelta(minutes=2)


def names(fake, installation: Installation) -> set[str]:
    return {r["name"] for r in fake.runners(installation.github_id)}


def calls_for(fake, installation: Installation, since: int = 0) -> list[tuple[str, str]]:
    """The installation's API calls, from the `since`-th call the fake recorded on."""
    return [(m, p) for m, p, inst in fake.calls[since:] if inst == installation.github_id]


# -- POLL-11 -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll11_only_an_unexplained_idle_zoomies_registration_is_removed(fake, app, clock, started):
    acme = install(fake, "acme", ("app",))
    register(app, acme, "zoomies-linux-x64-orphan")
    go_online(fake, register(app, acme, "zoomies-linux-x64-busy"))
    fake.queue_job("acme/app", LABELS, duration=3600)  # the busy one takes it
    make_runner(name="zoomies-linux-x64-live", state="idle")
    register(app, acme, "zoomies-linux-x64-live")
    renamed = register(app, acme, "zoomies-linux-x64-by-id")
    make_runner(
        name="zoomies-linux-x64-other-name", state="registering", github_runner_id=renamed.runner_id
    )
    make_runner(name="zoomies-linux-x64-failed", state="failed")
    register(app, acme, "zoomies-linux-x64-failed")  # a failed row explains nothing
    register(app, acme, "build-box-7")  # not ours: never touched
    assert {r["name"]: r["busy"] for r in fake.runners(acme.github_id)}[
        "zoomies-linux-x64-busy"
    ] is True

    report = reap_step(clock.now(), started_at=started, app=app, clock=clock)

    assert names(fake, acme) == {
        "zoomies-linux-x64-busy",
        "zoomies-linux-x64-live",
        "zoomies-linux-x64-by-id",
        "build-box-7",
    }
    assert sorted(report.deleted) == [
        "acme:zoomies-linux-x64-failed",
        "acme:zoomies-linux-x64-orphan",
    ]
    assert report.kept_busy == ["acme:zoomies-linux-x64-busy"]
    assert report.kept_foreign == ["acme:build-box-7"]
    assert AuditLog.objects.filter(action="github.registration_deleted").count() == 2


@pytest.mark.django_db
def test_poll11_a_delete_github_answers_busy_is_left_alone(fake, app, clock, started):
    """The list said idle, then the runner took a job: the 422 wins."""
    acme = install(fake, "acme", ("app",))
    jit = register(app, acme, "zoomies-linux-x64-racer")

    class StaleList:
        """The listing as it was a moment before the job landed."""

        def __init__(self, real):
            self.real = real

        def for_installation(self, installation_id):
            client = self.real.for_installation(installation_id)
            listed = client.list_runners

            def list_runners(**scope):
                runners = listed(**scope)
                go_online(fake, jit)
                fake.queue_job("acme/app", LABELS, duration=3600)
                return runners

            client.list_runners = list_runners
            return client

    report = reap_step(clock.now(), started_at=started, app=StaleList(app), clock=clock)
    assert report.kept_busy == ["acme:zoomies-linux-x64-racer"]
    assert report.deleted == []
    assert names(fake, acme) == {"zoomies-linux-x64-racer"}


@pytest.mark.django_db
def test_poll11_a_repository_installation_is_reaped_one_list_per_repository(
    fake, app, clock, started
):
    mona = install(fake, "mona", ("one", "two"), kind=Installation.Kind.REPO)
    register(app, mona, "zoomies-linux-x64-a", repo="mona/one")
    register(app, mona, "zoomies-linux-x64-b", repo="mona/two")
    mark = len(fake.calls)
    report = reap_step(clock.now(), started_at=started, app=app, clock=clock)
    assert sorted(report.deleted) == [
        "mona/one:zoomies-linux-x64-a",
        "mona/two:zoomies-linux-x64-b",
    ]
    lists = [c for c in calls_for(fake, mona, mark) if c[0] == "GET"]
    assert lists == [
        ("GET", "/repos/mona/one/actions/runners"),
        ("GET", "/repos/mona/two/actions/runners"),
    ]


# -- POLL-08 / POLL-09 ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll09_the_first_refusal_stops_that_installation_and_stands_it_down(
    fake, app, clock, started
):
    limited = install(fake, "limited", ("app",))
    fine = install(fake, "fine", ("app",))
    for n in range(3):
        register(app, limited, f"zoomies-linux-x64-l{n}")
    register(app, fine, "zoomies-linux-x64-f0")

    class LimitAfterList:
        """GitHub's quota for `limited` runs out just after its list call."""

        def for_installation(self, installation_id):
            client = app.for_installation(installation_id)
            if installation_id == limited.github_id:
                listed = client.list_runners

                def list_runners(**scope):
                    runners = listed(**scope)
                    fake.rate_limit(limited.github_id, reset_in=300)
                    return runners

                client.list_runners = list_runners
            return client

    mark = len(fake.calls)
    report = reap_step(clock.now(), started_at=started, app=LimitAfterList(), clock=clock)

    deletes = [c for c in calls_for(fake, limited, mark) if c[0] == "DELETE"]
    assert len(deletes) == 1  # refused, and nothing more was asked
    assert len(names(fake, limited)) == 3
    assert report.stood_down == {limited.github_id: clock.now() + timedelta(seconds=300)}
    limited.refresh_from_db()
    assert limited.standdown_until == clock.now() + timedelta(seconds=300)
    assert "reap" in limited.standdown_reason
    # The other installation carried on.
    assert report.deleted == ["fine:zoomies-linux-x64-f0"]


@pytest.mark.django_db
def test_poll08_the_reap_and_the_poller_honour_each_others_stand_down(fake, app, clock, started):
    acme = install(fake, "acme", ("app",))
    register(app, acme, "zoomies-linux-x64-orphan")
    fake.rate_limit(acme.github_id, reset_in=600)
    mark = len(fake.calls)
    # A refusal met by the reap sets the stand-down (reset in 10 min)...
    first = reap_step(clock.now(), started_at=started, app=app, clock=clock)
    assert list(first.stood_down) == [acme.github_id]
    assert calls_for(fake, acme, mark) == [("GET", "/orgs/acme/actions/runners")]
    # ...which the poller honours,
    polled = poll_step(clock.now(), app=app, clock=clock)
    assert polled.skipped_standdown == [acme.github_id]
    # and one set by the poller is honoured by the reap, even when the reap is due.
    Installation.objects.filter(pk=acme.pk).update(last_reaped_at=None)
    again = reap_step(clock.now(), started_at=started, app=app, clock=clock)
    assert again.skipped_standdown == [acme.github_id]
    assert len(calls_for(fake, acme, mark)) == 1
    assert names(fake, acme) == {"zoomies-linux-x64-orphan"}


# -- POLL-10 ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll10_the_reap_runs_a_minute_after_start_then_every_ten_minutes(fake, app, clock):
    acme = install(fake, "acme", ("app",))
    started = clock.now()

    def reap_after(seconds: float):
        clock.advance(seconds)
        return reap_step(clock.now(), started_at=started, app=app, clock=clock)

    def lists() -> int:
        return sum(1 for m, p in calls_for(fake, acme) if m == "GET" and p.endswith("/runners"))

    assert reap_after(30).not_due == [acme.github_id] and lists() == 0
    assert reap_after(30).checked == [acme.github_id] and lists() == 1  # 1 min after start
    assert reap_after(5 * 60).not_due == [acme.github_id] and lists() == 1
    assert reap_after(4 * 60 + 59).not_due == [acme.github_id] and lists() == 1
    assert reap_after(1).checked == [acme.github_id] and lists() == 2  # 10 min after the last
    acme.refresh_from_db()
    assert acme.last_reaped_at == clock.now()


@pytest.mark.django_db
def test_poll10_after_a_restart_the_first_reap_is_again_a_minute_in(fake, app, clock):
    acme = install(fake, "acme", ("app",))
    Installation.objects.filter(pk=acme.pk).update(last_reaped_at=clock.now())
    clock.advance(3 * 60)
    restarted = clock.now()
    clock.advance(59)
    assert reap_step(clock.now(), started_at=restarted, app=app).not_due == [acme.github_id]
    clock.advance(1)
    assert reap_step(clock.now(), started_at=restarted, app=app).checked == [acme.github_id]


@pytest.mark.django_db
def test_poll10_one_list_call_per_organisation_installation(fake, app, clock, started):
    acme = install(fake, "acme", ("app", "lib", "web"))
    for n in range(3):
        register(app, acme, f"zoomies-linux-x64-{n}")
        make_runner(name=f"zoomies-linux-x64-{n}", state="idle")
    mark = len(fake.calls)
    reap_step(clock.now(), started_at=started, app=app, clock=clock)
    assert calls_for(fake, acme, mark) == [("GET", "/orgs/acme/actions/runners")]


@pytest.mark.django_db
def test_issue21_item21_restarts_a_minute_apart_no_longer_postpone_an_overdue_reap(
    fake, app, clock
):
    """Each start used to wait a minute before its first reap, so restarts less than a
    minute apart kept orphan registrations at GitHub for good. A reap ten minutes after the
    last is due at once, whenever the process started."""
    acme = install(fake, "acme", ("app",))
    Installation.objects.filter(pk=acme.pk).update(last_reaped_at=clock.now())
    for _restart in range(12):  # a restart every 50 s for ten minutes
        clock.advance(50)
        restarted = clock.now()
        result = reap_step(clock.now(), started_at=restarted, app=app)
        if result.checked:
            break
    assert result.checked == [acme.github_id]
    acme.refresh_from_db()
    assert clock.now() - timedelta(minutes=10) <= acme.last_reaped_at


@pytest.mark.django_db
def test_issue21_item7_a_registration_at_a_pools_old_repository_is_still_reaped(
    fake, app, clock, started
):
    """A pool registered a runner at acme/app, then was pointed at acme/lib: the reap used
    to list only the pools' repositories as they are now, so the acme/app registration
    stayed for good. The installation remembers where its runners registered; once nothing
    of ours is left there, it forgets the place."""
    from runners.actions.lifecycle import NewRunner, create_runner  # noqa: PLC0415

    acme = install(fake, "acme", ("app", "lib"))  # an organisation: its org target, and pools
    pool = Pool.objects.create(name="zoomies-app", labels=["app"], repository="acme/app",
                               installation=acme)  # fmt: skip
    host = make_host()
    jit = register(app, acme, "zoomies-app-1-aaaaaa", repo="acme/app")
    row = create_runner(
        NewRunner(pool=pool, installation=acme, host_id=host.pk, name="zoomies-app-1-aaaaaa",
                  github_runner_id=jit.runner_id, image="", env={}, command=None, reason="t",
                  cpus=None, memory_mb=None),
        now=timezone.now(), actor="test",
    )  # fmt: skip
    acme.refresh_from_db()
    assert acme.registered_repositories == ["acme/app"]
    Runner.objects.filter(pk=row.pk).update(state="failed")  # its runner never ran
    Pool.objects.filter(pk=pool.pk).update(repository="acme/lib")  # and the pool moved

    report = reap_step(clock.now(), started_at=started, app=app, clock=clock)
    assert "acme/app:zoomies-app-1-aaaaaa" in report.deleted
    assert {r["name"] for r in fake.runners(acme.github_id)} == set()
    clock.advance(11 * 60)
    reap_step(clock.now(), started_at=started, app=app, clock=clock)
    acme.refresh_from_db()
    assert acme.registered_repositories == []  # nothing of ours left there: forgotten
