"""The poll fallback against the fake GitHub with every webhook dropped (POLL-01..07).

One clock is shared by the fake, the client and the `now` each sweep is given, so a test
moves time instead of sleeping.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import AgentTask
from runners.github import config
from runners.github.client import GitHubApp
from runners.models import Installation, Job
from runners.poller import poll_step, runner_gone_problems, webhook_fresh_window
from runners.problems import github_problems, runners_problems
from runners.transitions import transition_runner
from tests.runners.conftest import (
    finish_job,
    go_online,
    install,
    make_host,
    make_runner,
    register,
    wakes_asked,
)
from zoomies_site.core import registry

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
    wakes = wakes_asked()

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
    assert wakes_asked() == wakes + 1


@pytest.mark.django_db
def test_poll01_an_installation_without_a_repository_list_is_asked_for_one(fake, sweep):
    acme = install(fake, "acme", ("app",), list_repos=False)
    job = fake.queue_job("acme/app", LABELS)
    sweep()
    assert Job.objects.get().github_id == job
    assert ("GET", "/installation/repositories") in calls_for(fake, acme)


@pytest.mark.django_db
def test_poll01_poll_fallback_is_on_by_default_and_off_means_no_calls(fake, sweep, _isolated):

    assert registry.get("github.poll_fallback") is True
    install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    _isolated.set(poll_fallback="false")
    report = sweep()
    assert not report.enabled
    assert fake.calls == [] and Job.objects.count() == 0


@pytest.mark.django_db
def test_a_second_sweep_changes_nothing_wakes_nothing_and_costs_no_quota(fake, sweep):
    acme = install(fake, "acme", ("app",))
    fake.queue_job("acme/app", LABELS)
    assert sweep().changed
    wakes, used = wakes_asked(), fake.quota_used(acme.github_id)
    again = sweep()
    assert again.jobs_seen == 0 and again.runs_listed == 0 and not again.changed
    assert wakes_asked() == wakes
    # Both run lists were asked for again, conditionally, and answered 304: not counted.
    # The runs created since the first sweep are asked for the first time: one call.
    assert fake.quota_used(acme.github_id) == used + 1
    assert [a[3] for a in fake.answers[-3:]] == [304, 304, 200]
    # A third sweep in the same five minutes asks that same listing again: a 304 too.
    used = fake.quota_used(acme.github_id)
    third = sweep()
    assert third.runs_listed == 0 and not third.changed
    assert fake.quota_used(acme.github_id) == used
    assert [a[3] for a in fake.answers[-3:]] == [304, 304, 304]


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


@pytest.mark.django_db
def test_issue29_item4_a_run_github_answers_404_for_is_not_asked_after_for_ever(fake, sweep, clock):
    """A queued job here whose run GitHub does not know (a signed delivery for a run since
    deleted, or of a repository gone): each sweep asked for the run's jobs, got 404, and
    the job stayed queued, demand for a runner that could never take it. The first 404
    completes it here; the next sweep asks nothing about that run."""
    acme = install(fake, "acme", ("app",))
    live = fake.queue_job("acme/app", LABELS)
    sweep()
    ghost_run = fake.job(live)["run_id"] + 10_000
    now = clock.now()
    Job.objects.create(
        github_id=live + 10_000, run_id=ghost_run, installation=acme, repository="acme/app",
        labels=list(LABELS), status="queued", created_at=now, updated_at=now,
    )  # fmt: skip
    clock.advance(60)

    sweep()

    ghost = Job.objects.get(github_id=live + 10_000)
    assert (ghost.status, ghost.conclusion) == ("completed", "")
    # The job is asked after by its own id before anything ends: one GitHub still has
    # (here, a row that names the wrong run) stays as GitHub says.
    assert [p for m, p in calls_for(fake, acme) if p.endswith(f"/jobs/{live + 10_000}")]
    assert Job.objects.get(github_id=live).status == "queued"  # its run is GitHub's
    asked = [p for p in _run_job_lists(fake, acme) if f"/runs/{ghost_run}/" in p]
    assert len(asked) == 1
    clock.advance(60)
    sweep()
    assert [p for p in _run_job_lists(fake, acme) if f"/runs/{ghost_run}/" in p] == asked
    misfiled = Job.objects.get(github_id=live)
    Job.objects.filter(pk=misfiled.pk).update(run_id=ghost_run + 1)
    clock.advance(60)
    sweep()
    assert Job.objects.get(github_id=live).status == "queued"  # GitHub still has it


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
def test_poll02_a_known_queued_job_taken_by_another_runner_stops_being_demand(
    fake, app, sweep, clock
):
    acme = install(fake, "acme", ("app",))
    job_id = fake.queue_job("acme/app", LABELS, duration=600)
    sweep()
    assert Job.objects.get(github_id=job_id).status == "queued"
    clock.advance(1)  # GitHub's updated_at has whole seconds
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
        last_webhook_at=clock.now() - timedelta(minutes=2),
        last_polled_at=clock.now() - timedelta(minutes=1),  # its safety sweep is not due
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
    assert "limited" in held["title"] and "rate limited" in held["detail"].lower()
    # Issue 29 item 4: the reason is a sentence of its own, not run into the next one.
    reason = held["detail"].split(". ", 1)[1]
    assert reason[0].isupper() and ". Until then the poller" in held["detail"]

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


# -- the safety sweep and its budget (issue 8 item 5) -------------------------------------------


def _run_job_lists(fake, installation: Installation) -> list[str]:
    return [p for m, p in calls_for(fake, installation) if p.endswith("/jobs")]


@pytest.mark.django_db(transaction=True)
def test_poll03_a_dropped_queued_delivery_amid_flowing_webhooks_is_found_by_the_safety_sweep(
    fake, sweep, clock, live_server, _isolated
):
    """POLL-03: webhooks keep arriving, so the installation is never polled in full, yet the
    one job whose `queued` delivery GitHub dropped is found within the safety interval."""
    secret = "sweep-secret"
    _isolated.set(webhook_secrets=secret)
    fake.webhook_url, fake.webhook_secret = f"{live_server.url}/webhooks/github", secret
    acme = install(fake, "acme", ("app",))
    interval = timedelta(minutes=2)
    assert _isolated and interval == timedelta(minutes=2)  # github.safety_sweep_interval
    delivered = 0

    def webhook_job() -> int:
        nonlocal delivered
        job = fake.queue_job("acme/app", LABELS)
        delivered += 1
        assert fake.wait_deliveries(delivered)[-1]["status_code"] == 200
        return job

    webhook_job()
    dropped_at = None
    found_at = None
    for step in range(24):  # 20 s apart: a steady flow for eight minutes
        clock.advance(20)
        webhook_job()
        if step == 5:
            fake.set_delivery(drop=True)
            lost = fake.queue_job("acme/app", LABELS)
            delivered += 1
            fake.set_delivery()
            dropped_at = clock.now()
        report = sweep()
        assert report.polled == []  # webhooks are arriving: never the full poll
        if found_at is None and Job.objects.filter(github_id=lost if dropped_at else 0).exists():
            found_at = clock.now()
            assert report.safety_swept == [acme.github_id]
    assert dropped_at is not None and found_at is not None, "the dropped job was never found"
    assert found_at - dropped_at <= interval
    assert Job.objects.get(github_id=lost).source == "poll"
    # Only the unknown run's jobs were listed: the 25 runs webhooks told us of cost nothing.
    assert len(_run_job_lists(fake, acme)) == 1


@pytest.mark.slow  # over 20 s of a worker: .ci/run's slow pass, on both databases
@pytest.mark.django_db
def test_poll05_a_burst_of_180_queued_runs_costs_bounded_calls(fake, sweep, clock):
    """POLL-05: 180 queued runs, no webhook, a sweep every 5 s for ten minutes: each run's
    jobs are listed once, and the unchanged lists answer 304, which GitHub does not count."""
    acme = install(fake, "acme", ("app",))
    for _ in range(180):
        fake.queue_job("acme/app", LABELS)
    for _ in range(120):
        sweep()
        clock.advance(5)
    assert Job.objects.filter(status="queued").count() == 180
    # 180 run job lists, the queued list's two pages and the in-progress list's one, once;
    # the old poller listed every run's jobs on every sweep (21,600 calls: four hours' quota).
    assert len(_run_job_lists(fake, acme)) == 180
    # + the new-runs listing, counted when its hour's URL is first asked and when a run
    # changes (none does here: the 180 stay queued), + the token mint's refresh slack.
    assert fake.quota_used(acme.github_id) <= 180 + 3 + 2 + 1


@pytest.mark.django_db
def test_poll05_with_webhooks_arriving_a_burst_of_180_costs_only_the_list_pages(fake, sweep, clock):
    """POLL-05: when webhooks told us of every run, a safety sweep lists no run's jobs."""
    acme = install(fake, "acme", ("app",))
    for _ in range(180):
        fake.queue_job("acme/app", LABELS)
    sweep()  # learns them, as the webhooks would have
    Installation.objects.filter(pk=acme.pk).update(last_webhook_at=clock.now())
    mark, lists = len(fake.answers), len(_run_job_lists(fake, acme))
    for _ in range(30):  # an hour of safety sweeps
        clock.advance(120)
        Installation.objects.filter(pk=acme.pk).update(last_webhook_at=clock.now())
        assert sweep().safety_swept == [acme.github_id]
    assert len(_run_job_lists(fake, acme)) == lists
    answers = [a for a in fake.answers[mark:] if a[2] == acme.github_id]
    # Three conditional calls a sweep: one per page of the queued list (180 runs, 100 a
    # page), each answered 304, which GitHub does not count against the hour; and the first
    # page of the runs created since the last sweep, counted only when its URL moves to the
    # next hour (the 180 runs stay queued, so its answer does not change within the hour).
    assert len(answers) == 30 * 3
    queued_pages = [a for i, a in enumerate(answers) if i % 3 != 2]
    assert {a[3] for a in queued_pages} == {304}
    counted = [a for a in answers if a[3] != 304]
    assert len(counted) <= 2, counted


@pytest.mark.django_db
def test_poll05_the_sweep_stops_at_its_share_of_the_hourly_quota(fake, sweep, clock, _isolated):
    """POLL-05: past `github.sweep_budget` of X-RateLimit-Limit the sweep makes no call; the
    rest of the hour is left for runners, and the next window sweeps again."""
    _isolated.set(sweep_budget="0.25")
    acme = install(fake, "acme", ("app",))
    job = fake.queue_job("acme/app", LABELS)
    fake.spend_quota(acme.github_id, 1300)  # others spent 26% of 5,000 this hour
    report = sweep()
    assert acme.github_id in report.over_budget
    assert "github.sweep_budget" in report.over_budget[acme.github_id]
    assert len(calls_for(fake, acme)) == 1  # one call to learn the quota, then nothing
    assert not Job.objects.exists()
    again = sweep()
    assert acme.github_id in again.over_budget and len(calls_for(fake, acme)) == 1
    clock.advance(3600)  # the window resets
    sweep()
    assert Job.objects.get().github_id == job


@pytest.mark.django_db
def test_poll03_a_job_that_joins_a_known_queued_run_with_its_delivery_dropped_is_found(
    fake, sweep, clock
):
    """POLL-03: a run the webhooks told us of gains a job whose `queued` was dropped; the
    run's `updated_at` moves, so the safety sweep lists that run's jobs, and only that."""
    acme = install(fake, "acme", ("app",))
    first = fake.queue_job("acme/app", LABELS)
    other = fake.queue_job("acme/app", LABELS)
    sweep()  # as the webhooks would have: both runs' jobs are known
    Installation.objects.filter(pk=acme.pk).update(
        last_webhook_at=clock.now(), last_polled_at=clock.now()
    )
    clock.advance(125)
    Installation.objects.filter(pk=acme.pk).update(last_webhook_at=clock.now())
    assert sweep().safety_swept == [acme.github_id]  # meets the known runs, lists none
    lists = len(_run_job_lists(fake, acme))
    clock.advance(5)
    joined = fake.queue_job("acme/app", LABELS, run_id=fake.job(first)["run_id"])
    clock.advance(120)
    Installation.objects.filter(pk=acme.pk).update(last_webhook_at=clock.now())
    assert sweep().safety_swept == [acme.github_id]
    assert Job.objects.get(github_id=joined).status == "queued"
    listed = _run_job_lists(fake, acme)[lists:]
    assert listed == [f"/repos/acme/app/actions/runs/{fake.job(first)['run_id']}/jobs"]
    assert fake.job(other)["run_id"] != fake.job(first)["run_id"]


def _webhooks_flowing(installation: Installation, clock) -> None:
    """As if another delivery of this installation had just arrived: the safety-sweep mode."""
    Installation.objects.filter(pk=installation.pk).update(last_webhook_at=clock.now())


@pytest.mark.django_db
def test_poll02_a_lost_in_progress_and_completed_amid_flowing_webhooks_are_made_good(
    fake, app, sweep, clock
):
    """POLL-02 (issue 11 item 2): webhooks keep arriving, so only safety sweeps run, yet a
    job whose `in_progress` and then `completed` deliveries were lost converges with GitHub
    within one safety interval each: the open job's run is asked after."""
    acme = install(fake, "acme", ("app",))
    host = make_host()
    runner = make_runner(state="idle", installation=acme, host=host)
    job_id = fake.queue_job("acme/app", LABELS, duration=600)
    _webhooks_flowing(acme, clock)
    assert sweep().safety_swept == [acme.github_id]
    assert Job.objects.get(github_id=job_id).status == "queued"
    # The runner takes the job; the in_progress delivery never reaches us (silent fake).
    session = go_online(fake, register(app, acme, runner.name))
    assert fake.job(job_id)["status"] == "in_progress"
    clock.advance(125)
    _webhooks_flowing(acme, clock)
    report = sweep()
    assert report.safety_swept == [acme.github_id] and report.polled == []
    job = Job.objects.get(github_id=job_id)
    assert (job.status, job.runner_id) == ("in_progress", runner.pk)

    finish_job(fake, session, job_id)  # and the completed delivery is lost too
    clock.advance(125)
    _webhooks_flowing(acme, clock)
    assert sweep().safety_swept == [acme.github_id]
    job.refresh_from_db()
    assert (job.status, job.conclusion) == ("completed", "success")
    runner.refresh_from_db()
    assert runner.state == "draining"
    # Bounded: one run listing per sweep for the one open job, no more.
    assert len(_run_job_lists(fake, acme)) <= 3


@pytest.mark.django_db
def test_poll02_a_job_every_delivery_of_which_was_lost_is_recorded_by_the_next_sweep(
    fake, app, sweep, clock
):
    """POLL-02, HOOK-03 (issue 28, the delivery-chaos drill): a job queued, run on our runner
    and finished between two safety sweeps, its `queued`, `in_progress` and `completed`
    deliveries all lost (the silent fake), is in no queued list and no open row of ours
    names its run; the next sweep finds it among the runs created since the last one and
    records it as GitHub has it, and ends its runner. A job that finished on someone else's
    runner is recorded too (the webhook would have), and neither run is listed again."""
    acme = install(fake, "acme", ("app",))
    runner = make_runner(state="idle", installation=acme, host=make_host())
    _webhooks_flowing(acme, clock)
    assert sweep().safety_swept == [acme.github_id]
    session = go_online(fake, register(app, acme, runner.name))
    clock.advance(10)
    ours = fake.queue_job("acme/app", LABELS, duration=600)
    assert fake.job(ours)["runner_name"] == runner.name
    finish_job(fake, session, ours)
    theirs_session = go_online(fake, register(app, acme, "their-build-box"))
    theirs = fake.queue_job("acme/app", LABELS, duration=600)
    finish_job(fake, theirs_session, theirs, conclusion="failure")
    assert not Job.objects.filter(github_id__in=[ours, theirs]).exists()

    clock.advance(125)
    _webhooks_flowing(acme, clock)
    report = sweep()

    assert report.safety_swept == [acme.github_id] and report.polled == []
    job = Job.objects.get(github_id=ours)
    assert (job.status, job.conclusion, job.runner_name) == ("completed", "success", runner.name)
    assert job.source == "poll"
    runner.refresh_from_db()
    assert runner.state == "draining"
    other = Job.objects.get(github_id=theirs)
    assert (other.status, other.conclusion) == ("completed", "failure")
    lists = len(_run_job_lists(fake, acme))
    assert lists == 2
    clock.advance(125)
    _webhooks_flowing(acme, clock)
    assert not sweep().changed
    assert len(_run_job_lists(fake, acme)) == lists


@pytest.mark.django_db
def test_poll05_a_restarted_controller_lists_only_the_runs_that_changed_while_it_was_down(
    fake, app, clock, django_capture_on_commit_callbacks
):
    """POLL-05 (issue 11 item 9): the memory of listed runs outlives the process. A new
    process (its own client, no ETags, its first sweep a full one) lists the run queued while
    it was down and asks after the job cancelled meanwhile, not the 180 runs it knew."""
    acme = install(fake, "acme", ("app",))
    jobs = [fake.queue_job("acme/app", LABELS) for _ in range(180)]
    with django_capture_on_commit_callbacks(execute=True):
        poll_step(clock.now(), app=app, clock=clock)
    assert len(_run_job_lists(fake, acme)) == 180
    app.close()  # the controller dies; meanwhile one job is queued and another cancelled
    clock.advance(30)
    joined = fake.queue_job("acme/app", LABELS)
    fake.cancel_job(jobs[7])
    mark = len(_run_job_lists(fake, acme))
    restarted = GitHubApp(fake.app_id, fake.private_key_pem, fake.url, clock=clock)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            report = poll_step(clock.now(), app=restarted, clock=clock, started_at=clock.now())
    finally:
        restarted.close()
    assert report.polled == [acme.github_id]
    listed = _run_job_lists(fake, acme)[mark:]
    runs = {fake.job(j)["run_id"] for j in (joined, jobs[7])}
    assert sorted(listed) == sorted(f"/repos/acme/app/actions/runs/{r}/jobs" for r in runs)
    assert Job.objects.get(github_id=joined).status == "queued"
    assert Job.objects.get(github_id=jobs[7]).status == "completed"


@pytest.mark.django_db
def test_poll02_a_sweep_its_budget_stops_half_way_has_made_a_lost_completed_good_first(
    fake, app, sweep, clock, _isolated
):
    """POLL-02, POLL-05: the open jobs' runs are asked after before unknown runs are listed,
    so a sweep with three calls of its share left still makes a lost `completed` good."""
    _isolated.set(sweep_budget="0.25")
    acme = install(fake, "acme", ("app",))
    runner = make_runner(state="idle", installation=acme, host=make_host())
    job_id = fake.queue_job("acme/app", LABELS)
    _webhooks_flowing(acme, clock)
    sweep()
    session = go_online(fake, register(app, acme, runner.name))
    finish_job(fake, session, job_id)  # its in_progress and completed deliveries are lost
    unknown = [fake.queue_job("acme/app", ["self-hosted", "gpu"]) for _ in range(5)]
    fake.spend_quota(acme.github_id, 1250 - 3 - fake.quota_used(acme.github_id))
    clock.advance(125)
    _webhooks_flowing(acme, clock)
    report = sweep()
    assert acme.github_id in report.over_budget
    assert Job.objects.get(github_id=job_id).status == "completed"
    assert Job.objects.filter(github_id__in=unknown).count() < len(unknown)


# -- issue 21 item 3: a job whose runner is gone -----------------------------------------------


def _runner_failed(runner, clock, message: str = "the runner exited with code 2") -> None:
    transition_runner(runner.pk, "failed", now=clock.now(), actor="agent:h1", message=message)


def _ours_and_theirs_in_one_run(fake, app, acme, runner) -> tuple[int, int]:
    """Job A on our runner and job B, of the same run, on someone else's: the run stays in
    progress while B runs, whatever becomes of A."""
    session = go_online(fake, register(app, acme, runner.name))
    ours = fake.queue_job("acme/app", LABELS, duration=3600)
    go_online(fake, register(app, acme, "their-build-box"))
    theirs = fake.queue_job("acme/app", LABELS, duration=3600, run_id=fake.job(ours)["run_id"])
    assert fake.job(ours)["runner_name"] == runner.name
    assert fake.job(theirs)["runner_name"] == "their-build-box"
    return ours, session


@pytest.mark.django_db
def test_issue21_item3_a_job_whose_runner_is_gone_is_asked_after_though_its_run_is_unchanged(
    fake, app, sweep, clock
):
    """Issue 21 item 3: our runner died mid-job; GitHub ended the job within the second the
    sweep had listed its run (whose `updated_at` has whole seconds), and the run stays in
    progress for another job. The run's stamp never moves, so it was never listed again and
    the job stayed `in_progress` here for good; a job whose runner is gone is asked after on
    every sweep."""
    acme = install(fake, "acme", ("app",))
    runner = make_runner(state="idle", installation=acme, host=make_host())
    ours, session = _ours_and_theirs_in_one_run(fake, app, acme, runner)
    sweep()
    job = Job.objects.get(github_id=ours)
    assert job.status == "in_progress"
    _runner_failed(runner, clock)
    finish_job(fake, session, ours, conclusion="failure")  # the same second as the listing
    clock.advance(60)

    sweep()

    job.refresh_from_db()
    assert (job.status, job.conclusion) == ("completed", "failure")


@pytest.mark.django_db
def test_issue21_item3_a_job_still_in_progress_past_the_bound_after_its_runner_ended_is_named(
    fake, app, sweep, clock
):
    """Issue 21 item 3: the runner is gone (failed, exit 2) but GitHub still shows its job in
    progress. Each sweep asks GitHub after it (the in-progress sweep); the problems list names
    it once runners.runner_gone_job_warning (15 min by default) has passed since the runner
    ended, and not before; a job on a live runner, or on someone else's, is not named."""
    assert registry.get("runners.runner_gone_job_warning") == timedelta(minutes=15)
    acme = install(fake, "acme", ("app",))
    runner = make_runner(state="idle", installation=acme, host=make_host())
    ours, _session = _ours_and_theirs_in_one_run(fake, app, acme, runner)
    live = make_runner(state="idle", installation=acme, host=make_host())
    go_online(fake, register(app, acme, live.name))
    running = fake.queue_job("acme/app", LABELS, duration=3600)
    assert fake.job(running)["runner_name"] == live.name
    sweep()
    assert Job.objects.get(github_id=running).status == "in_progress"
    _runner_failed(runner, clock)
    lists_before = len(_run_job_lists(fake, acme))

    clock.advance(14 * 60)
    sweep()
    assert len(_run_job_lists(fake, acme)) > lists_before  # GitHub was asked after it
    assert Job.objects.get(github_id=ours).status == "in_progress"  # and said so
    assert runner_gone_problems(clock.now()) == []

    clock.advance(61)
    found = [p for p in runners_problems(clock.now()) if p["key"] == "jobs.runner_gone"]
    assert len(found) == 1, found
    assert found[0]["title"].startswith("1 job(s) still in progress more than 15 min")
    assert f"acme/app job {ours} (runner {runner.name} failed)" in found[0]["detail"]
    assert str(running) not in found[0]["detail"]
