"""GET /metrics (issue 10 item 9): Prometheus text, behind a viewer's credentials; database
gauges worked out at scrape time; counters from the sites that count; several processes
added up through PROMETHEUS_MULTIPROC_DIR."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from fleet.models import AgentTask, Host
from runners.actions import JobUpdate, apply_job_update
from runners.github.client import GitHubApp
from runners.github.fake import FakeGitHub
from runners.models import Installation, Job, Pool, Runner
from runners.poller import poll_step
from runners.reconcile import reconcile_once
from tests.accounts.conftest import client_for, make_user, mint
from zoomies_site.core import metrics
from zoomies_site.metrics_view import exposition

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_sec02_a_scrape_needs_a_viewer_or_a_read_token():
    """SEC-02, EVT-08: GET /metrics answers Prometheus text to a viewer or a fleet:read token
    and to no one else."""
    assert client_for().get("/metrics").status_code == 401
    assert client_for(token="zpt_wrong").get("/metrics").status_code == 401
    owner = make_user("otto", "operator")
    assert client_for(token=mint(owner, [])).get("/metrics").status_code == 403
    answer = client_for(token=mint(owner, ["fleet:read"])).get("/metrics")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain")
    seen = samples(answer.content.decode())  # Prometheus' own parser reads every line
    assert ("zoomies_task_queue_depth", ()) in seen
    assert "# TYPE zoomies_task_queue_depth gauge" in answer.content.decode()
    assert client_for(make_user("vera", "viewer")).get("/metrics").status_code == 200


def test_the_gauges_count_what_the_database_holds():
    """EVT-08: the fleet's gauges, worked out from the rows at scrape time."""
    inst = Installation.objects.create(
        github_id=1, account="acme", standdown_until=timezone.now() + timedelta(minutes=5)
    )
    pool = Pool.objects.create(name="zoomies-a", installation=inst, backend="process")
    host = Host.objects.create(name="zoomies-h", capacity=3, backends=["process"])
    Host.objects.create(name="zoomies-g", capacity=3, backends=["process"], health="lost")
    for i, state in enumerate(["idle", "idle", "busy"]):
        runner = Runner.objects.create(
            name=f"zoomies-a-{i}",
            pool=pool,
            host=host,
            state=state,
            created_at=T0,
            state_changed_at=T0,
        )
    AgentTask.objects.create(
        host=host, runner=runner, kind="stop_runner", lease_seconds=60, created_at=T0
    )
    for i, status in enumerate(["queued", "queued", "in_progress", "completed"]):
        Job.objects.create(
            github_id=i,
            repository="acme/app",
            labels=[],
            status=status,
            created_at=T0,
            updated_at=T0,
        )
    seen = samples(exposition().decode())
    assert seen[("zoomies_jobs", (("status", "queued"),))] == 2
    assert seen[("zoomies_jobs", (("status", "in_progress"),))] == 1
    assert seen[("zoomies_runners", (("pool", "zoomies-a"), ("state", "idle")))] == 2
    assert seen[("zoomies_runners", (("pool", "zoomies-a"), ("state", "busy")))] == 1
    assert seen[("zoomies_hosts", (("cordoned", "false"), ("health", "lost")))] == 1
    assert seen[("zoomies_agent_tasks_open", (("kind", "stop_runner"), ("state", "pending")))] == 1
    assert seen[("zoomies_task_queue_depth", ())] == 0
    assert seen[("zoomies_installations_standing_down", ())] == 1
    # The capacity layer's series are served too.
    assert any(name.startswith("zoomies_capacity_") for name, _labels in seen)


def test_the_scrape_costs_a_fixed_number_of_queries(django_assert_max_num_queries):
    pool = Pool.objects.create(name="zoomies-a", backend="process")
    for i in range(30):
        Runner.objects.create(
            name=f"zoomies-a-{i}", pool=pool, state="idle", created_at=T0, state_changed_at=T0
        )
    # One query per family read from rows; the hosts' lent memory is the ninth (HOST-29).
    with django_assert_max_num_queries(9):
        exposition()


def test_webhook_deliveries_are_counted_by_outcome(client):
    before = value("zoomies_webhook_deliveries_total", outcome="bad_signature")
    answer = client.post(
        "/webhooks/github",
        b"{}",
        content_type="application/json",
        HTTP_X_GITHUB_EVENT="ping",
        HTTP_X_GITHUB_DELIVERY="d1",
        HTTP_X_HUB_SIGNATURE_256="sha256=00",
    )
    assert answer.status_code == 401
    assert value("zoomies_webhook_deliveries_total", outcome="bad_signature") == before + 1
    assert metrics.webhook_outcome(200, {"duplicate": True}) == "duplicate"
    assert metrics.webhook_outcome(200, {"ok": True}) == "accepted"
    assert metrics.webhook_outcome(400, {}) == "invalid"


def test_github_calls_are_counted_by_route_and_status():
    fake = FakeGitHub().start()
    try:
        acme = fake.add_installation(
            account="acme", account_type="Organization", repositories=["acme/app"]
        )
        route = "/app/installations/{id}"
        before = value("zoomies_github_api_calls_total", method="GET", route=route, status="200")
        with GitHubApp(fake.app_id, fake.private_key_pem, base_url=fake.url) as app:
            app.installation(acme)
        after = value("zoomies_github_api_calls_total", method="GET", route=route, status="200")
        assert after == before + 1
    finally:
        fake.stop()
    assert metrics.github_route("/repos/acme/app/actions/runs/5/jobs") == (
        "/repos/{owner}/{repo}/actions/runs/{id}/jobs"
    )
    assert (
        metrics.github_route("/orgs/acme/actions/runners/7") == "/orgs/{org}/actions/runners/{id}"
    )


def test_the_poller_standing_a_rate_limited_installation_down_counts_one_standdown():
    """EVT-08: the stand-down is counted once in zoomies_github_rate_limit_standdowns_total,
    by what was calling, and served; a sweep that skips the held installation adds none."""
    fake = FakeGitHub(webhook_url=None).start()
    try:
        github_id = fake.add_installation("acme", "Organization", ["acme/app"])
        Installation.objects.create(github_id=github_id, account="acme", repositories=["acme/app"])
        fake.rate_limit(github_id, reset_in=120)
        before = value("zoomies_github_rate_limit_standdowns_total", by="system:poller")
        with GitHubApp(fake.app_id, fake.private_key_pem, base_url=fake.url) as app:
            report = poll_step(timezone.now(), app=app)
            assert list(report.stood_down) == [github_id]
            after = value("zoomies_github_rate_limit_standdowns_total", by="system:poller")
            assert after == before + 1
            assert poll_step(timezone.now(), app=app).skipped_standdown == [github_id]
        assert value("zoomies_github_rate_limit_standdowns_total", by="system:poller") == after
        seen = samples(exposition().decode())
        key = ("zoomies_github_rate_limit_standdowns_total", (("by", "system:poller"),))
        assert seen[key] == after
    finally:
        fake.stop()


def test_a_reconcile_pass_is_timed():
    before = value("zoomies_reconcile_pass_seconds_count")
    reconcile_once(timezone.now())
    assert value("zoomies_reconcile_pass_seconds_count") == before + 1


def test_a_jobs_queue_time_is_observed_when_it_starts(django_capture_on_commit_callbacks):
    before_count = value("zoomies_job_queue_seconds_count")
    before_sum = value("zoomies_job_queue_seconds_sum")
    update = JobUpdate(
        github_id=77,
        run_id=1,
        repository="acme/app",
        name="build",
        labels=("self-hosted",),
        status="queued",
        created_at=T0,
    )
    with django_capture_on_commit_callbacks(execute=True):
        apply_job_update(update, installation=None, now=T0, source="webhook", actor="test")
    assert value("zoomies_job_queue_seconds_count") == before_count
    started = JobUpdate(
        github_id=77,
        run_id=1,
        repository="acme/app",
        name="build",
        labels=("self-hosted",),
        status="in_progress",
        created_at=T0,
        started_at=T0 + timedelta(seconds=42),
    )
    with django_capture_on_commit_callbacks(execute=True):
        apply_job_update(started, installation=None, now=T0, source="webhook", actor="test")
    assert value("zoomies_job_queue_seconds_count") == before_count + 1
    assert value("zoomies_job_queue_seconds_sum") == before_sum + 42


CHILD = """
import sys
from zoomies_site.core import metrics
for _ in range(int(sys.argv[1])):
    metrics.WEBHOOK_DELIVERIES.labels(outcome="accepted").inc()
"""


def test_several_processes_are_added_up_through_the_multiprocess_directory(tmp_path, monkeypatch):
    directory = tmp_path / "prometheus"
    (directory).mkdir()
    (directory / "counter_999.db").write_bytes(b"left by a dead controller")
    metrics.clear_multiproc_dir(directory)
    assert list(directory.iterdir()) == []
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "PATH": "/usr/bin:/bin"}
    for count in (2, 3):
        subprocess.run(
            [sys.executable, "-c", CHILD, str(count)],
            env=env,
            check=True,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    seen = samples(exposition().decode())
    assert seen[("zoomies_webhook_deliveries_total", (("outcome", "accepted"),))] == 5
