"""The poll fallback against the fake GitHub with every webhook dropped (POLL-01..07).

One clock is shared by the fake, the client and the `now` each sweep is given, so a test
moves time instead of sleeping.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import AgentTask
from runners import wake
from runners.models import Installation, Job
from runners.poller import poll_step, webhook_fresh_window
from runners.problems import github_problems
from tests.runners.conftest import (
    finish_job,
    go_online,
    install,
    make_host,
    make_runner,
    register,
)

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
def sweep(app, clock, django_capture_on_commit_callbacks):
    """One poll sweep at the shared clock's now, its on-commit wake run as on a real commit."""

    def _sweep():
        with django_capture_on_commit_callbacks(execute=True):
            return poll_step(clock.now(), app=app, clock=clock)

    return _sweep


def calls_for(fake, installation: Installation) -> list[tuple[str, str]]:
    return [(m, p) for m, p, inst in fake.calls if inst == installation.github_id]


# -- POLL-01 -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll01_the_poller_alone_records_the_queued_jobs(fake, sweep, clock):
    acme = install(fake, "acme", ("app", "lib"))
    first = fake.queue_job("acme/app", LABELS)
    second = fake.queue_job("acme/lib", LABELS, name="test")
    assert all(d["status_code"] is None for d in fake.deliveries)  # no webhook reached us
    wakes = wake.wake_count

    report = sweep()

    assert report.polled == [acme.github_id]
    jobs = {j.github_id: j for j in Job.objects.all()}
    assert set(jobs) == {first, second}
    assert {j.status for j in jobs.values()} == {"queued"}
    assert {j.source for j in jobs.values()} == {"poll"}
    assert {j.installation_id for j in jobs.values()} == {acme.pk}
    assert jobs[second].repository == "acme/lib" and jobs[second].labels == LABELS
    acme.refresh_from_db()
    assert acme.last_polled_at == clock.now()
    assert wake.wake_count == wakes + 1


@pytest.mark.django_db
def test_poll01_an_installation_without_a_repository_list_is_asked_for_one(fake, sweep):
    acme = install(fake, "acme", ("app",), list_repos=False)
    job = fake.queue_job("acme/app", LABELS)
    sweep()
    assert Job.objects.get().github_id == job
    assert ("GET", "/installation/repositories") in calls_for(fake, acme)


@pytest.mark.django_db
def test_poll01_poll_fallback_is_on_by_default_and_off_means_no_calls(fake, sweep, _isolated):
    from zoomies_site import registry

    assert registry.get("github.poll_fallback") is True
    install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    _isolated.set(poll_fallback="false")
    report = sweep()
    assert not report.enabled
    assert fake.calls == [] and Job.objects.count() == 0


@pytest.mark.django_db
def test_a_second_sweep_changes_nothing_and_wakes_nothing(fake, sweep):
    install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    assert sweep().changed
    wakes = wake.wake_count
    again = sweep()
    assert again.jobs_seen == 1 and not again.changed
    assert wake.wake_count == wakes


@pytest.mark.django_db
def test_poll01_a_job_cancelled_between_sweeps_stops_being_demand(fake, sweep):
    """Its run left the active listing; the poller asks after it instead of keeping it queued."""
    install(fake, "acme", ("app",))
    job_id = fake.queue_job("acme/app", LABELS)
    sweep()
    fake.cancel_job(job_id)
    report = sweep()
    job = Job.objects.get(github_id=job_id)
    assert (job.status, job.conclusion, job.source) == ("completed", "cancelled", "poll")
    assert report.changed


# -- POLL-02 -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll02_a_job_already_running_on_one_of_our_runners_makes_it_busy(fake, app, sweep):
    acme = install(fake, "acme", ("app",))
    runner = make_runner(state="idle", installation=acme)
    go_online(fake, register(app, acme, runner.name))
    job_id = fake.queue_job("acme/app", LABELS, duration=600)
    assert fake.job(job_id)["status"] == "in_progress"  # taken at once, far inside an interval

    sweep()

    job = Job.objects.get(github_id=job_id)
    runner.refresh_from_db()
    assert (job.status, job.runner_id, job.source) == ("in_progress", runner.pk, "poll")
    assert runner.state == "busy"


@pytest.mark.django_db
def test_poll02_a_job_that_finished_between_sweeps_ends_and_drains_its_runner(fake, app, sweep):
    acme = install(fake, "acme", ("app",))
    host = make_host()
    runner = make_runner(state="idle", installation=acme, host=host)
    session = go_online(fake, register(app, acme, runner.name))
    job_id = fake.queue_job("acme/app", LABELS, duration=600)
    sweep()
    runner.refresh_from_db()
    assert runner.state == "busy"
    finish_job(fake, session, job_id)

    sweep()

    job = Job.objects.get(github_id=job_id)
    runner.refresh_from_db()
    assert (job.status, job.conclusion, job.runner_id) == ("completed", "success", runner.pk)
    assert runner.state == "draining"  # HOOK-06's path, reached without a webhook
    assert AgentTask.objects.get(runner=runner).kind == "stop_runner"


@pytest.mark.django_db
def test_poll02_a_job_running_on_someone_elses_runner_is_not_ours_to_record(fake, app, sweep):
    acme = install(fake, "acme", ("app",))
    go_online(fake, register(app, acme, "their-build-box"))
    theirs = fake.queue_job("acme/app", LABELS, duration=600)
    assert fake.job(theirs)["status"] == "in_progress"
    sweep()
    assert not Job.objects.filter(github_id=theirs).exists()


@pytest.mark.django_db
def test_poll02_a_known_queued_job_taken_by_another_runner_stops_being_demand(fake, app, sweep):
    acme = install(fake, "acme", ("app",))
    job_id = fake.queue_job("acme/app", LABELS, duration=600)
    sweep()
    assert Job.objects.get(github_id=job_id).status == "queued"
    go_online(fake, register(app, acme, "their-build-box"))
    assert fake.job(job_id)["status"] == "in_progress"
    sweep()
    assert Job.objects.get(github_id=job_id).status == "in_progress"


# -- POLL-03 -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll03_an_installation_whose_webhooks_arrive_is_skipped_the_other_still_polled(
    fake, sweep, clock
):
    hooked = install(fake, "hooked", ("app",))
    silent = install(fake, "silent", ("app",))
    Installation.objects.filter(pk=hooked.pk).update(
        last_webhook_at=clock.now() - timedelta(minutes=2)
    )
    fake.queue_job("hooked/app", LABELS)
    silent_job = fake.queue_job("silent/app", LABELS)

    report = sweep()

    assert report.skipped_webhooks == [hooked.github_id]
    assert report.polled == [silent.github_id]
    assert calls_for(fake, hooked) == []
    assert list(Job.objects.values_list("github_id", flat=True)) == [silent_job]


@pytest.mark.django_db
def test_poll03_webhooks_that_stopped_longer_ago_than_the_window_no_longer_count(
    fake, sweep, clock
):
    assert webhook_fresh_window() == timedelta(minutes=10)  # 3 x 60 s, floored at 10 min
    went_quiet = install(fake, "quiet", ("app",))
    Installation.objects.filter(pk=went_quiet.pk).update(
        last_webhook_at=clock.now() - timedelta(minutes=11)
    )
    fake.queue_job("quiet/app", LABELS)
    assert sweep().polled == [went_quiet.github_id]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_poll03_deliveries_from_before_a_restart_do_not_count_so_the_first_sweep_catches_up(
    fake, app, clock, django_capture_on_commit_callbacks
):
    """POLL-03: GitHub never redelivers what a stopped controller refused."""
    acme = install(fake, "acme", ("app",))
    Installation.objects.filter(pk=acme.pk).update(
        last_webhook_at=clock.now() - timedelta(minutes=2)
    )
    missed = fake.queue_job("acme/app", LABELS)
    started_at = clock.now() - timedelta(seconds=30)  # the controller restarted after it
    with django_capture_on_commit_callbacks(execute=True):
        report = poll_step(clock.now(), app=app, clock=clock, started_at=started_at)
    assert report.polled == [acme.github_id]
    assert list(Job.objects.values_list("github_id", flat=True)) == [missed]
    # A delivery after the start counts again: the next sweep leaves it to the webhooks.
    Installation.objects.filter(pk=acme.pk).update(last_webhook_at=clock.now())
    with django_capture_on_commit_callbacks(execute=True):
        report = poll_step(clock.now(), app=app, clock=clock, started_at=started_at)
    assert report.skipped_webhooks == [acme.github_id]


# -- POLL-04 -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll04_the_problems_list_says_when_it_runs_on_polling_alone(fake, sweep, clock):
    acme = install(fake, "acme", ("app",))
    assert github_problems(clock.now()) == []  # nothing has polled yet
    sweep()
    problems = github_problems(clock.now())
    assert [p["key"] for p in problems] == ["github.polling_only"]
    assert problems[0]["title"] == (
        "Running on polling alone: no webhook from GitHub has ever arrived"
    )
    assert problems[0]["severity"] == "warning" and problems[0]["detail"]

    last = clock.now() - timedelta(minutes=45)
    Installation.objects.filter(pk=acme.pk).update(last_webhook_at=last)
    (problem,) = github_problems(clock.now())
    assert problem["title"].startswith(
        "Running on polling alone: no webhook from GitHub has arrived since "
        f"{last:%Y-%m-%d %H:%M:%S} UTC"
    )

    Installation.objects.filter(pk=acme.pk).update(last_webhook_at=clock.now())
    assert github_problems(clock.now()) == []


@pytest.mark.django_db
def test_poll04_no_polling_alone_problem_once_polls_have_stopped(fake, sweep, clock):
    install(fake, "acme", ("app",))
    sweep()
    clock.advance(10 * 60)
    assert github_problems(clock.now()) == []


# -- POLL-05..07 -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_poll05_one_rate_limited_installation_stands_down_and_the_others_are_polled(
    fake, sweep, clock
):
    limited = install(fake, "limited", ("app",))
    fine = install(fake, "fine", ("app",))
    fake.queue_job("limited/app", LABELS)
    fine_job = fake.queue_job("fine/app", LABELS)
    fake.rate_limit(limited.github_id, reset_in=120)

    report = sweep()

    assert list(report.stood_down) == [limited.github_id]
    assert report.polled == [fine.github_id]
    assert list(Job.objects.values_list("github_id", flat=True)) == [fine_job]
    limited.refresh_from_db()
    assert limited.standdown_until > clock.now()
    assert "rate limited" in limited.standdown_reason


@pytest.mark.django_db
def test_poll06_the_stand_down_lasts_until_githubs_reset_and_no_longer(fake, sweep, clock):
    limited = install(fake, "limited", ("app",))
    job_id = fake.queue_job("limited/app", LABELS)
    fake.rate_limit(limited.github_id, reset_in=120)
    start = clock.now()

    sweep()
    limited.refresh_from_db()
    assert limited.standdown_until == start + timedelta(seconds=120)  # not a fixed 15 min
    refused = len(calls_for(fake, limited))

    clock.advance(60)
    report = sweep()
    assert report.skipped_standdown == [limited.github_id]
    assert len(calls_for(fake, limited)) == refused  # not asked before the reset
    (held,) = [p for p in github_problems(clock.now()) if p["key"] == "github.standdown"]
    assert "limited" in held["title"] and "rate limited" in held["detail"]

    clock.advance(60)  # the reset instant
    report = sweep()
    assert report.polled == [limited.github_id]
    assert Job.objects.get().github_id == job_id
    limited.refresh_from_db()
    assert limited.standdown_until is None and limited.standdown_reason == ""


@pytest.mark.django_db
def test_poll06_a_retry_after_answer_is_honoured_too(fake, sweep, clock):
    limited = install(fake, "limited", ("app",))
    fake.rate_limit(limited.github_id, reset_in=None, retry_after=90)
    sweep()
    limited.refresh_from_db()
    assert limited.standdown_until == clock.now() + timedelta(seconds=90)


@pytest.mark.django_db
def test_poll07_an_answer_with_no_time_waits_the_fallback(fake, sweep, clock):
    limited = install(fake, "limited", ("app",))
    fake.rate_limit(limited.github_id, reset_in=None, retry_after=None)
    sweep()
    limited.refresh_from_db()
    assert limited.standdown_until == clock.now() + timedelta(minutes=15)
    assert "no time" in limited.standdown_reason


@pytest.mark.django_db
def test_poll07_no_stand_down_lasts_longer_than_an_hour(fake, sweep, clock):
    limited = install(fake, "limited", ("app",))
    fake.rate_limit(limited.github_id, reset_in=5 * 3600)
    sweep()
    limited.refresh_from_db()
    assert limited.standdown_until == clock.now() + timedelta(hours=1)
    assert "cap" in limited.standdown_reason


# -- the configured App ---------------------------------------------------------------------------


@pytest.fixture
def configured(fake, _isolated, tmp_path):
    """The registry names the fake as the GitHub App (the key file through its env name)."""
    key = tmp_path / "app.pem"
    key.write_text(fake.private_key_pem)
    _isolated.set(app_id=fake.app_id, api_url=fake.url)
    _isolated.setenv("ZOOMIES_GITHUB_PRIVATE_KEY_FILE", str(key))
    return key


@pytest.mark.django_db
def test_with_no_app_configured_a_sweep_does_nothing(fake):
    install(fake, "acme", ("app",))
    report = poll_step(timezone.now())
    assert not report.configured and fake.calls == []


@pytest.mark.django_db
def test_a_sweep_uses_the_configured_app_by_default(fake, configured, clock):
    install(fake, "acme", ("app",))
    job_id = fake.queue_job("acme/app", LABELS)
    assert poll_step(clock.now()).polled
    assert Job.objects.get().github_id == job_id


@pytest.mark.django_db
def test_the_app_is_cached_and_rebuilt_when_its_configuration_changes(fake, configured, _isolated):
    from runners.github import config

    first = config.get_app()
    assert first is not None and first.base_url == fake.url and first.app_id == fake.app_id
    assert config.get_app() is first
    configured.write_text(fake.private_key_pem + "\n")  # the key file replaced
    second = config.get_app()
    assert second is not None and second is not first
    _isolated.set(app_id=fake.app_id + 1)
    assert config.get_app().app_id == fake.app_id + 1
    _isolated.set(app_id=0)
    assert config.get_app() is None
