"""`POST /webhooks/github` (HOOK-01..07, ARCH-06), over a real socket where it matters.

The signature, refusal and acceptance tests post to pytest-django's live server with httpx;
the ones about what an accepted delivery does to rows use Django's test client, where a
socket adds nothing. No test here needs GitHub: the endpoint never calls it (HOOK-04).
"""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from pathlib import Path

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from accounts.models import AuditLog
from fleet.models import AgentTask
from runners.github.config import get_app
from runners.models import Installation, Job, Pool, Runner, WebhookDelivery
from runners.webhooks import sign, signature_matches
from tests.runners.conftest import (
    WEBHOOK_SECRET,
    make_host,
    make_runner,
    wakes_asked,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "github" / "webhooks"
URL = "/webhooks/github"


def example(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def headers(body: bytes, event: str, *, secret: str = WEBHOOK_SECRET, delivery: str | None = None):
    return {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/test",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body, secret),
    }


def encode(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def row_counts() -> dict[str, int]:
    return {
        "deliveries": WebhookDelivery.objects.count(),
        "jobs": Job.objects.count(),
        "audit": AuditLog.objects.count(),
        "installations": Installation.objects.count(),
    }


def job_payload(action: str, *, job_id: int = 4242, runner_name: str | None = None) -> dict:
    """The example delivery for `action`, for one job of ours."""
    source = {
        "queued": "workflow_job.queued.json",
        "in_progress": "workflow_job.in_progress.json",
        "completed": "workflow_job.completed.success.with-organization.json",
        "waiting": "workflow_job.waiting.json",
    }[action]
    payload = copy.deepcopy(example(source))
    payload["workflow_job"]["id"] = job_id
    payload["workflow_job"]["labels"] = ["self-hosted", "linux"]
    if runner_name is not None:
        payload["workflow_job"]["runner_name"] = runner_name
    payload["repository"]["full_name"] = "acme/app"
    payload["installation"] = {"id": 77}
    return payload


@pytest.fixture(autouse=True)
def _secrets(github_settings):
    github_settings.set(webhook_secrets=WEBHOOK_SECRET)
    return github_settings


@pytest.fixture
def post(client, django_capture_on_commit_callbacks):
    """Post through Django's test client, running on-commit hooks as a real commit would."""

    def _post(payload: dict, event: str = "workflow_job", **kw):
        body = encode(payload)
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(
                URL, data=body, content_type="application/json", headers=headers(body, event, **kw)
            )

    return _post


# -- HOOK-01: the signature -----------------------------------------------------------------


def test_hook01_the_signature_helper_matches_githubs_official_test_vector():
    body = b"Hello, World!"
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert sign(body, "It's a Secret to Everybody") == expected
    assert signature_matches(body, expected, ["another secret", "It's a Secret to Everybody"])
    assert not signature_matches(body, expected, ["another secret"])
    assert not signature_matches(body + b" ", expected, ["It's a Secret to Everybody"])


def test_the_route_is_webhooks_github():
    assert reverse("runners:github-webhook") == URL


@pytest.mark.django_db(transaction=True)
def test_hook01_a_validly_signed_delivery_is_accepted_over_a_real_socket(live_server, acme):
    body = encode(job_payload("queued"))
    answer = httpx.post(live_server.url + URL, content=body, headers=headers(body, "workflow_job"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["ok"] is True
    job = Job.objects.get(github_id=4242)
    assert (job.status, job.repository, job.source) == ("queued", "acme/app", "webhook")
    assert job.labels == ["self-hosted", "linux"]
    assert WebhookDelivery.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "signature",
    [
        None,  # missing
        "",
        "sha256=" + "0" * 64,
        "sha1=7d38cdd689735b008b3c702edd92eea23791c5f6",  # the legacy header's form
        "garbage",
    ],
    ids=["missing", "empty", "wrong-digest", "sha1", "garbage"],
)
def test_hook01_a_missing_or_bad_signature_is_401_and_records_nothing(live_server, signature):
    body = encode(job_payload("queued"))
    sent = headers(body, "workflow_job")
    if signature is None:
        del sent["X-Hub-Signature-256"]
    else:
        sent["X-Hub-Signature-256"] = signature
    before = row_counts()
    answer = httpx.post(live_server.url + URL, content=body, headers=sent)
    assert answer.status_code == 401
    assert "error" in answer.json()
    assert row_counts() == before == {"deliveries": 0, "jobs": 0, "audit": 0, "installations": 0}


@pytest.mark.django_db(transaction=True)
def test_hook01_a_body_signed_with_another_secret_or_then_altered_is_refused(live_server):
    body = encode(job_payload("queued"))
    wrong = httpx.post(
        live_server.url + URL, content=body, headers=headers(body, "workflow_job", secret="nope")
    )
    altered = httpx.post(
        live_server.url + URL,
        content=body.replace(b"acme/app", b"acme/other"),
        headers=headers(body, "workflow_job"),
    )
    assert (wrong.status_code, altered.status_code) == (401, 401)
    assert WebhookDelivery.objects.count() == 0 and Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_hook01_with_no_secret_configured_nothing_is_accepted(live_server, _secrets):
    _secrets.set(webhook_secrets=None)
    body = encode(job_payload("queued"))
    answer = httpx.post(live_server.url + URL, content=body, headers=headers(body, "workflow_job"))
    assert answer.status_code == 401
    assert "webhook secret is not configured" in answer.json()["error"]
    assert WebhookDelivery.objects.count() == 0 and Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_hook01_the_singular_environment_alias_and_a_second_secret_both_verify(
    live_server, _secrets, acme
):
    """A rotation: the registry's list plus ZOOMIES_GITHUB_WEBHOOK_SECRET."""
    _secrets.set(webhook_secrets="old-secret")
    _secrets.setenv("ZOOMIES_GITHUB_WEBHOOK_SECRET", "new-secret")
    for n, secret in enumerate(["old-secret", "new-secret"]):
        body = encode(job_payload("queued", job_id=100 + n))
        answer = httpx.post(
            live_server.url + URL,
            content=body,
            headers=headers(body, "workflow_job", secret=secret),
        )
        assert answer.status_code == 200, answer.text
    assert Job.objects.count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2, 3]",
        b"\xff\xfe",
        encode({"action": "queued"}),  # no workflow_job
        encode({**job_payload("queued"), "workflow_job": {"status": "queued"}}),  # no id
        encode({k: v for k, v in job_payload("queued").items() if k != "repository"}),
        encode(
            {
                **job_payload("queued"),
                "workflow_job": {**job_payload("queued")["workflow_job"], "labels": "linux"},
            }
        ),
    ],
    ids=["not-json", "not-object", "not-utf8", "no-job", "no-id", "no-repository", "bad-labels"],
)
def test_a_malformed_body_is_400_and_records_nothing(live_server, body):
    answer = httpx.post(live_server.url + URL, content=body, headers=headers(body, "workflow_job"))
    assert answer.status_code == 400
    assert isinstance(answer.json()["error"], str)
    assert WebhookDelivery.objects.count() == 0 and Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_body_over_the_cap_is_413_and_records_nothing(live_server, _secrets):
    _secrets.set(webhook_secrets=WEBHOOK_SECRET, webhook_max_body=64 * 1024)
    payload = job_payload("queued")
    payload["padding"] = "x" * (70 * 1024)
    body = encode(payload)
    answer = httpx.post(live_server.url + URL, content=body, headers=headers(body, "workflow_job"))
    assert answer.status_code == 413
    assert WebhookDelivery.objects.count() == 0 and Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_delivery_larger_than_djangos_upload_limit_is_still_read(live_server, acme):
    """GitHub sends up to 25 MB; Django's request.body would refuse over 2.5 MB."""
    payload = job_payload("queued")
    payload["workflow_job"]["steps"] = [{"name": "x" * 1000}] * 3000  # about 3 MB
    body = encode(payload)
    answer = httpx.post(live_server.url + URL, content=body, headers=headers(body, "workflow_job"))
    assert answer.status_code == 200, answer.text
    assert Job.objects.filter(github_id=4242).exists()


@pytest.mark.django_db(transaction=True)
def test_get_is_not_allowed(live_server):
    assert httpx.get(live_server.url + URL).status_code == 405


# -- every real example -------------------------------------------------------------------------

EVENTS = {
    "installation.created.json": "installation",
    "installation_repositories.added.json": "installation_repositories",
    "ping.json": "ping",
    "workflow_job.completed.success.with-organization.json": "workflow_job",
    "workflow_job.in_progress.json": "workflow_job",
    "workflow_job.queued.json": "workflow_job",
    "workflow_job.waiting.json": "workflow_job",
}


def test_every_example_payload_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.json")) == sorted(EVENTS)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(EVENTS))
def test_each_example_payload_is_accepted_as_github_sent_it(live_server, name):
    body = (EXAMPLES / name).read_bytes()  # the file's bytes, signed as they are
    delivery = str(uuid.uuid4())
    answer = httpx.post(
        live_server.url + URL, content=body, headers=headers(body, EVENTS[name], delivery=delivery)
    )
    assert answer.status_code == 200, answer.text
    recorded = WebhookDelivery.objects.get(delivery_id=delivery)
    payload = json.loads(body)
    assert recorded.event == EVENTS[name]
    assert recorded.action == payload.get("action", "")
    if EVENTS[name] == "workflow_job" and payload.get("installation"):
        # Its installation is not configured: recorded, and the job not ours (issue 29 item
        # 2). The same bytes from a configured installation make the job, below.
        assert answer.json()["ignored"].startswith("installation ")
        assert not Job.objects.exists()
        owner = payload["repository"]["owner"]["login"]
        Installation.objects.create(github_id=payload["installation"]["id"], account=owner)
        delivery = str(uuid.uuid4())
        again = headers(body, EVENTS[name], delivery=delivery)
        answer = httpx.post(live_server.url + URL, content=body, headers=again)
        assert answer.status_code == 200 and "ignored" not in answer.json(), answer.text
    if EVENTS[name] == "workflow_job":
        job = Job.objects.get(github_id=payload["workflow_job"]["id"])
        assert job.status == payload["action"]
        assert job.repository == payload["repository"]["full_name"]
        assert job.labels == payload["workflow_job"]["labels"]
        assert job.run_id == payload["workflow_job"]["run_id"]
    else:
        assert Job.objects.count() == 0


@pytest.mark.django_db
def test_the_installation_created_example_adds_the_installation(post):
    answer = post(example("installation.created.json"), "installation")
    assert answer.status_code == 200
    inst = Installation.objects.get(github_id=957387)
    # A personal account's runners are per repository.
    assert (inst.account, inst.kind) == ("Codertocat", "repo")
    assert inst.repositories == ["Codertocat/Hello-World"]
    assert inst.last_webhook_at is not None
    added = post(example("installation_repositories.added.json"), "installation_repositories")
    assert added.status_code == 200
    inst.refresh_from_db()
    assert inst.repositories == ["Codertocat/Hello-World", "Codertocat/Space"]


@pytest.mark.django_db
def test_an_unknown_event_is_recorded_and_acknowledged(post):
    answer = post({"zen": "hello", "hook_id": 1}, "meta")
    assert answer.status_code == 200
    assert WebhookDelivery.objects.get().event == "meta"
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_queued_action_with_status_waiting_is_taken_as_queued(post, acme):
    """GitHub can send `action: queued` with `status: waiting`; the action wins."""
    payload = job_payload("queued")
    payload["workflow_job"]["status"] = "waiting"
    assert post(payload).status_code == 200
    assert Job.objects.get(github_id=4242).status == "queued"


@pytest.mark.django_db
def test_timestamps_are_stored_as_aware_datetimes(post, acme):
    assert post(job_payload("completed")).status_code == 200
    job = Job.objects.get(github_id=4242)
    assert job.started_at.isoformat() == "2021-08-05T10:34:58+00:00"
    assert job.completed_at.isoformat() == "2021-08-05T10:38:16+00:00"
    assert job.conclusion == "success"


# -- HOOK-02: redelivery -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_hook02_a_redelivery_under_the_same_id_changes_nothing(live_server, acme):
    delivery = str(uuid.uuid4())
    first = encode(job_payload("queued"))
    answer = httpx.post(
        live_server.url + URL,
        content=first,
        headers=headers(first, "workflow_job", delivery=delivery),
    )
    assert answer.status_code == 200
    acme.refresh_from_db()
    seen_at = acme.last_webhook_at
    before = row_counts()
    wakes = wakes_asked()
    # Even a body that would move the job, if it came under the same delivery id.
    for body in (first, encode(job_payload("completed"))):
        again = httpx.post(
            live_server.url + URL,
            content=body,
            headers=headers(body, "workflow_job", delivery=delivery),
        )
        assert again.status_code == 200
        assert again.json()["duplicate"] is True
    assert row_counts() == before
    assert Job.objects.get(github_id=4242).status == "queued"
    acme.refresh_from_db()
    assert acme.last_webhook_at == seen_at
    assert wakes_asked() == wakes


# -- HOOK-03: order ------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "order", list(itertools.permutations(["queued", "in_progress", "completed"])), ids="-".join
)
def test_hook03_every_order_of_deliveries_leaves_the_job_completed(post, acme, order):
    runner = make_runner(name="zoomies-linux-x64-7", state="idle", host=make_host())
    for action in order:
        assert post(job_payload(action, runner_name=runner.name)).status_code == 200
    job = Job.objects.get(github_id=4242)
    assert job.status == "completed"
    assert job.conclusion == "success"
    assert job.runner_id == runner.pk
    runner.refresh_from_db()
    assert runner.state == "draining"


# -- HOOK-05 / HOOK-06: the runner -------------------------------------------------------------


@pytest.mark.django_db
def test_hook05_in_progress_makes_the_named_runner_busy_and_links_the_job(post, acme):
    runner = make_runner(name="zoomies-linux-x64-5", state="idle", host=make_host())
    assert post(job_payload("queued", runner_name=runner.name)).status_code == 200
    job = Job.objects.get(github_id=4242)
    assert job.runner_id is None  # a queued job is never linked
    assert post(job_payload("in_progress", runner_name=runner.name)).status_code == 200
    job.refresh_from_db()
    runner.refresh_from_db()
    assert (job.status, job.runner_id, job.runner_name) == ("in_progress", runner.pk, runner.name)
    assert runner.state == "busy"


@pytest.mark.django_db
def test_hook05_a_job_on_someone_elses_runner_touches_no_runner(post, acme):
    ours = make_runner(name="zoomies-linux-x64-9", state="idle")
    assert post(job_payload("in_progress", runner_name="GitHub Actions 5")).status_code == 200
    assert Job.objects.get(github_id=4242).runner_id is None
    ours.refresh_from_db()
    assert ours.state == "idle"


@pytest.mark.django_db
def test_hook06_completed_ends_the_job_and_starts_removing_its_ephemeral_runner(post, acme):
    host = make_host()
    runner = make_runner(name="zoomies-linux-x64-6", state="busy", host=host)
    assert post(job_payload("completed", runner_name=runner.name)).status_code == 200
    job = Job.objects.get(github_id=4242)
    runner.refresh_from_db()
    assert job.status == "completed" and job.runner_id == runner.pk
    assert runner.state == "draining"
    stop = AgentTask.objects.get(runner=runner)
    assert (stop.kind, stop.host_id, stop.state) == ("stop_runner", host.pk, "pending")
    assert Runner.objects.get(pk=runner.pk).state == "draining"


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["idle", "registering"])
def test_hook06_a_completed_whose_in_progress_was_lost_lets_its_runner_exit_by_itself(
    post, acme, state
):
    """Issue 11 item 9 (the deliveries drill): the `in_progress` was dropped, so the runner
    still reads idle when `completed` names it. It ran the job and is exiting by itself: it
    gets a busy runner's drain grace, not a stop at once, which killed it mid-exit (code
    143), failed it, and the pool's start backoff then held the burst back for minutes."""
    host = make_host()
    runner = make_runner(name="zoomies-linux-x64-7", state=state, host=host)
    assert post(job_payload("completed", runner_name=runner.name)).status_code == 200
    runner.refresh_from_db()
    assert runner.state == "draining"
    stop = AgentTask.objects.get(runner=runner, kind="stop_runner")
    assert stop.payload["grace"] == 300  # runners.drain_grace
    moves = AuditLog.objects.filter(target_type="runner", target_id=str(runner.pk))
    assert [m.action for m in moves.order_by("pk")][-2:] == ["runner.busy", "runner.draining"]


# -- HOOK-07: credit ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_hook07_a_delivery_is_credited_to_the_installation_that_owns_the_repository(post, _secrets):
    """Two installations, two secrets; the secret that verified a delivery decides nothing."""
    _secrets.set(webhook_secrets="secret-a,secret-b")
    a = Installation.objects.create(github_id=1001, account="alpha", repositories=["alpha/web"])
    b = Installation.objects.create(github_id=2002, account="beta", repositories=["beta/api"])

    app_delivery = job_payload("queued", job_id=1)
    app_delivery["installation"] = {"id": 2002}
    app_delivery["repository"]["full_name"] = "beta/api"
    assert post(app_delivery, secret="secret-a").status_code == 200

    repo_hook = job_payload("queued", job_id=2)  # a repository hook: no installation object
    del repo_hook["installation"]
    repo_hook["repository"]["full_name"] = "alpha/web"
    assert post(repo_hook, secret="secret-b").status_code == 200

    by_owner = job_payload("queued", job_id=3)  # a repository not listed: its owner decides
    del by_owner["installation"]
    by_owner["repository"]["full_name"] = "beta/new-service"
    assert post(by_owner, secret="secret-a").status_code == 200

    credited = dict(WebhookDelivery.objects.values_list("repository", "installation__github_id"))
    assert credited == {"beta/api": 2002, "alpha/web": 1001, "beta/new-service": 2002}
    jobs = dict(Job.objects.values_list("github_id", "installation__github_id"))
    assert jobs == {1: 2002, 2: 1001, 3: 2002}
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.last_webhook_at is not None and b.last_webhook_at is not None


@pytest.mark.django_db
def test_hook07_a_delivery_for_a_repository_nobody_owns_credits_no_installation(post):
    Installation.objects.create(github_id=1001, account="alpha", repositories=["alpha/web"])
    payload = job_payload("queued")
    del payload["installation"]
    payload["repository"]["full_name"] = "stranger/thing"
    assert post(payload).status_code == 200
    assert WebhookDelivery.objects.get().installation is None
    assert Installation.objects.get().last_webhook_at is None


# -- HOOK-04: answer at once, wake the pass ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_hook04_the_answer_makes_no_github_call_and_wakes_the_reconcile_pass(
    live_server, _secrets, silent_github, acme, tmp_path
):
    """With an App configured against a fake GitHub, the endpoint still never calls it."""
    key = tmp_path / "app.pem"
    key.write_text(silent_github.private_key_pem)
    _secrets.set(
        webhook_secrets=WEBHOOK_SECRET,
        app_id=silent_github.app_id,
        private_key_file=key,
        api_url=silent_github.url,
    )

    assert get_app() is not None  # an App is there to be called, and is not
    wakes = wakes_asked()
    body = encode(job_payload("queued"))
    answer = httpx.post(live_server.url + URL, content=body, headers=headers(body, "workflow_job"))
    assert answer.status_code == 200
    # How fast it answers is bench/webhook_ingest.py's to measure, not this test's.
    assert wakes_asked() == wakes + 1  # on commit, before the answer went back
    assert silent_github.calls == []


@pytest.mark.django_db
def test_issue29_item2_a_job_from_an_installation_not_configured_here_is_nobodys(post):
    """A signed `workflow_job.queued` naming installation 9999, which is not configured,
    for a repository of an account another installation serves: it used to be credited to
    that installation by the account's name, and its pool minted a runner for it. It is
    recorded (a redelivery is a duplicate), counted as ignored, and makes no job row."""
    Installation.objects.create(github_id=1001, account="acme", repositories=["acme/app"])
    payload = job_payload("queued", job_id=99)
    payload["installation"] = {"id": 9999}
    answer = post(payload)
    assert answer.status_code == 200
    assert answer.json()["ignored"] == "installation 9999 is not configured here"
    assert WebhookDelivery.objects.get().installation is None
    assert not Job.objects.exists()
    assert Installation.objects.get().last_webhook_at is None


@pytest.mark.django_db
def test_issue29_item3_an_installation_deleted_at_github_is_removed_paused_audited_and_said(
    post, acme
):
    """`installation.deleted` used to change nothing: the row stayed active and after a
    restart the controller minted a token for it and swept it. Now it is removed (kept,
    inactive), its pools are paused, both audited, and the problems list says so."""
    from runners.problems import runners_problems  # noqa: PLC0415

    pool = Pool.objects.create(name="zoomies-acme", labels=["acme"], installation=acme)
    payload = {
        "action": "deleted",
        "installation": {"id": 77, "account": {"login": "acme", "type": "Organization"}},
        "sender": {"login": "someone"},
    }
    assert post(payload, event="installation").status_code == 200
    acme.refresh_from_db()
    pool.refresh_from_db()
    assert not acme.active and pool.paused
    actions = set(AuditLog.objects.values_list("action", flat=True))
    assert {"installation.remove", "pool.pause"} <= actions
    (problem,) = [p for p in runners_problems(timezone.now())
                  if p["key"] == "github.installation_removed"]  # fmt: skip
    assert "zoomies-acme" in problem["detail"]
