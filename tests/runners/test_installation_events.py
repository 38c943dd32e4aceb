"""What GitHub's deliveries about installations (and ones we must not act on) do, sent by
the fake GitHub over real HTTP to the live server, and what the controller asks GitHub
afterwards (issue 29 items 2, 3 and 4).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import AuditLog
from fleet.models import Host
from runners import reconcile
from runners.github import config as github_config
from runners.github.fake import FakeGitHub
from runners.github.programs import FAKE_RUNNER
from runners.models import Job, Pool, Runner, WebhookDelivery
from runners.poller import poll_step
from runners.problems import runners_problems
from runners.reap import reap_step
from tests.runners.conftest import WEBHOOK_SECRET, install
from zoomies_site.core import registry

LABELS = ["self-hosted", "linux"]


@pytest.fixture
def fake(live_server, github_settings, tmp_path, monkeypatch):
    """A fake GitHub whose webhooks reach the live server, and the App configured for it."""
    github_settings.set(webhook_secrets=WEBHOOK_SECRET)
    gh = FakeGitHub(webhook_url=f"{live_server.url}/webhooks/github",
                    webhook_secret=WEBHOOK_SECRET).start()  # fmt: skip
    key = tmp_path / "app.pem"
    key.write_text(gh.private_key_pem)
    monkeypatch.setenv("ZOOMIES_GITHUB_API_URL", gh.url)
    monkeypatch.setenv("ZOOMIES_GITHUB_APP_ID", str(gh.app_id))
    monkeypatch.setenv("ZOOMIES_GITHUB_PRIVATE_KEY_FILE", str(key))
    registry.reload()
    github_config.clear_cache()
    yield gh
    gh.stop()
    github_config.clear_cache()


def _pool(name: str, installation, repository: str = "") -> Pool:
    return Pool.objects.create(
        name=name, installation=installation, repository=repository, labels=["linux"],
        backend="process", platform="linux/x64", image=FAKE_RUNNER, max_runners=5,
    )  # fmt: skip


def _host() -> Host:
    return Host.objects.create(
        name="zoomies-host-1", capacity=4, backends=["process"], platform="linux/x64",
        last_heartbeat_at=timezone.now(),
    )  # fmt: skip


def _delivered(fake: FakeGitHub, count: int) -> list[dict]:
    sent = fake.wait_deliveries(count, timeout=10)
    assert all(d["status_code"] == 200 for d in sent), sent
    return sent


def _installation_calls(fake: FakeGitHub, installation_id: int) -> list[tuple]:
    """Calls made as the installation, and tokens minted for it."""
    token_path = f"/app/installations/{installation_id}/access_tokens"
    return [c for c in fake.calls if c[2] == installation_id or c[1] == token_path]


@pytest.mark.django_db(transaction=True)
def test_issue29_item2_a_job_of_an_installation_not_configured_here_gets_no_runner_of_another(
    fake,
):
    """A signed `workflow_job.queued` from an installation GitHub has (the App is on the
    account) but this controller does not serve, with labels a pool bound to acme matches:
    about 10 ms later acme's pool minted a JIT runner that could never get the job. The
    delivery is answered 200 and recorded, and no job row or runner comes of it."""
    acme = install(fake, "acme", ("app",))
    _pool("zoomies-acme", acme)
    _host()
    fake.add_installation("ghost", "Organization", ["ghost/app"])
    job_id = fake.queue_job(repo="ghost/app", labels=LABELS)
    _delivered(fake, 1)
    assert WebhookDelivery.objects.get().installation is None
    assert not Job.objects.filter(github_id=job_id).exists()
    reconcile.reconcile_now()
    assert not Runner.objects.exists()
    assert not [c for c in fake.calls if c[1].endswith("/generate-jitconfig")]


@pytest.mark.django_db(transaction=True)
def test_issue29_item3_an_uninstalled_installation_is_removed_and_never_asked_for_again(fake):
    """`installation.deleted` changed nothing: the row stayed active, and the controller
    kept minting tokens for the installation and sweeping it. Now it is removed, its pools
    are paused, both are audited, the problems list names it, and neither the pass, the
    poller nor the reap asks GitHub anything for it; the other installation carries on."""
    acme = install(fake, "acme", ("app",))
    other = install(fake, "other", ("app",))
    pool = _pool("zoomies-acme", acme)
    _host()
    fake.uninstall(acme.github_id)
    _delivered(fake, 1)
    acme.refresh_from_db()
    pool.refresh_from_db()
    assert not acme.active and pool.paused
    assert {"installation.remove", "pool.pause"} <= set(
        AuditLog.objects.values_list("action", flat=True)
    )
    (problem,) = [p for p in runners_problems(timezone.now())
                  if p["key"] == "github.installation_removed"]  # fmt: skip
    assert "zoomies-acme" in problem["detail"] and "acme" in problem["title"]

    before = len(_installation_calls(fake, acme.github_id))
    now = timezone.now()
    Job.objects.create(github_id=1, repository="acme/app", labels=LABELS, status="queued",
                       installation=acme, created_at=now, updated_at=now)  # fmt: skip
    reconcile.reconcile_now()
    started = now - timedelta(hours=1)  # every sweep and reap due
    poll_step(now, started_at=started)
    reap_step(now, started_at=started)
    assert len(_installation_calls(fake, acme.github_id)) == before
    assert _installation_calls(fake, other.github_id)  # the other one was swept and reaped
    assert not Runner.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_issue29_item3_a_repository_removed_from_the_installation_pauses_its_pools(fake):
    """`installation_repositories.removed` only edited the repository list: a pool
    registering at the removed repository kept minting there (404s that back off every
    pool of the installation). It is paused, audited and named in the problems list; the
    installation's other pools carry on."""
    acme = install(fake, "acme", ("app", "lib"))
    lib = _pool("zoomies-lib", acme, repository="acme/lib")
    app = _pool("zoomies-app", acme, repository="acme/app")
    _host()
    fake.remove_repositories(acme.github_id, ["acme/lib"])
    _delivered(fake, 1)
    lib.refresh_from_db()
    app.refresh_from_db()
    assert lib.paused and not app.paused
    acme.refresh_from_db()
    assert acme.active and acme.repositories == ["acme/app"]
    audited = AuditLog.objects.filter(action="installation.repositories_removed").get()
    assert audited.detail["pools_paused"] == ["zoomies-lib"]
    (problem,) = [p for p in runners_problems(timezone.now())
                  if p["key"].startswith("pool.repository_removed")]  # fmt: skip
    assert problem["key"] == "pool.repository_removed:zoomies-lib"
    assert "acme/lib" in problem["title"]


@pytest.mark.django_db(transaction=True)
def test_issue29_item4_a_workflow_job_action_we_do_not_know_makes_no_job_of_its_status(fake):
    """An unknown `action` made a job row from `workflow_job.status`. It is acknowledged
    (recorded, 200) and changes no job; a known action of the same job still does."""
    acme = install(fake, "acme", ("app",))
    job = {"id": 555, "run_id": 7, "status": "queued", "labels": LABELS, "name": "build",
           "created_at": "2026-11-01T12:00:00Z"}  # fmt: skip
    payload = {"action": "requeued", "workflow_job": job, "repository": {"full_name": "acme/app"},
               "installation": {"id": acme.github_id}}  # fmt: skip
    fake.send_event("workflow_job", payload)
    _delivered(fake, 1)
    assert WebhookDelivery.objects.get().action == "requeued"
    assert not Job.objects.exists()
    fake.send_event("workflow_job", {**payload, "action": "queued"})
    _delivered(fake, 2)
    assert Job.objects.get().github_id == 555
