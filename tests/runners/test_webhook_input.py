"""Signed deliveries with extreme fields never earn a 500 (issue 8 item 3; HOOK-01).

GitHub cannot send an id of 2^64 or an `action` that is an object, but a signed delivery
that does must still get a clear 400 that names the field, with nothing recorded. A field
GitHub could send oddly (a timestamp we cannot place) is dropped and the rest of the
delivery is kept. Each case goes through both routes: the Django view (WSGI) and
runners.webhook_asgi (what daphne serves).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import pytest

from runners import webhook_asgi
from runners.models import Installation, Job, WebhookDelivery
from runners.webhooks import sign
from tests.runners.conftest import WEBHOOK_SECRET
from tests.runners.test_webhooks import URL, job_payload

BIG = 2**63  # one past the largest BIGINT


@pytest.fixture(autouse=True)
def _secrets(github_settings):
    github_settings.set(webhook_secrets=WEBHOOK_SECRET)
    return github_settings


def signed_headers(body: bytes, event: str = "workflow_job") -> dict[str, str]:
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body, WEBHOOK_SECRET),
    }


def post_wsgi(client, body: bytes, event: str = "workflow_job"):
    answer = client.post(
        URL, data=body, content_type="application/json", headers=signed_headers(body, event)
    )
    return answer.status_code, json.loads(answer.content)


def post_asgi(body: bytes, event: str = "workflow_job", headers: dict | None = None):
    """One request through the ASGI app daphne runs for this route; (status, json)."""
    sent = {k.lower(): v for k, v in (headers or signed_headers(body, event)).items()}
    sent.setdefault("content-type", "application/json")
    sent.setdefault("content-length", str(len(body)))
    scope = {
        "type": "http",
        "method": "POST",
        "path": URL,
        "root_path": "",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in sent.items()],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    answered: list[dict] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        answered.append(message)

    asyncio.run(webhook_asgi.application(scope, receive, send))
    start = next(m for m in answered if m["type"] == "http.response.start")
    body_out = b"".join(m.get("body", b"") for m in answered if m["type"] == "http.response.body")
    return start["status"], json.loads(body_out)


# Transactional: the ASGI app writes from its own pool threads, which must see the rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["wsgi", "asgi"])
def post(request, client):
    if request.param == "wsgi":
        return lambda body, event="workflow_job": post_wsgi(client, body, event)
    return post_asgi


def queued(**job_fields) -> dict:
    payload = job_payload("queued")
    payload["workflow_job"].update(job_fields)
    return payload


def raw(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def deep(depth: int) -> bytes:
    return b'{"action": "queued", "x": ' + b"[" * depth + b"]" * depth + b"}"


REFUSED = {
    "job id 2^63": raw(queued(id=BIG)),
    "job id -2^63-1": raw(queued(id=-BIG - 1)),
    "job id 0": raw(queued(id=0)),
    "run id 2^64": raw(queued(run_id=2**64)),
    "installation id 2^63": raw({**job_payload("queued"), "installation": {"id": BIG}}),
    "action an object": raw({**job_payload("queued"), "action": {"a": 1}}),
    "action a list": raw({**job_payload("queued"), "action": ["queued"]}),
    "1000 deep": deep(1000),
    "100000 deep": deep(100_000),
    "NaN literal": raw(job_payload("queued")).replace(b'"run_id": ', b'"x": NaN, "run_id": '),
    "repository name 300 chars": raw(
        {**job_payload("queued"), "repository": {"full_name": "acme/" + "a" * 300}}
    ),
    "NUL in the repository name": raw(
        {**job_payload("queued"), "repository": {"full_name": "acme/a\u0000b"}}
    ),
    "NUL in a label": raw(queued(labels=["self-hosted", "x\u0000"])),
    "a lone surrogate in a label": raw(queued(labels=["self-hosted", "x\ud800"])),
    "a lone surrogate in the job name": raw(queued(name="build \udfff")),
    "a lone surrogate in the action": raw({**job_payload("queued"), "action": "queued\ud800"}),
    "conclusion of 100 chars": raw(queued(conclusion="c" * 100)),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_hook01_an_impossible_field_is_a_clear_400_and_records_nothing(post, case, caplog):
    caplog.set_level(logging.INFO)
    status, answer = post(REFUSED[case])
    assert status == 400, answer
    assert answer["error"]
    assert (WebhookDelivery.objects.count(), Job.objects.count()) == (0, 0)
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged"


@pytest.mark.parametrize(
    "created_at",
    [1e300, -1e20, 1e20, 2**70, "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+01:00"],
)
def test_hook01_a_timestamp_that_cannot_be_placed_is_dropped_and_the_job_kept(
    post, created_at, acme
):
    status, answer = post(raw(queued(created_at=created_at, id=5151, run_id=99)))
    assert status == 200, answer
    job = Job.objects.get(github_id=5151)
    assert (job.status, job.run_id, job.repository, job.labels) == (
        "queued",
        99,
        "acme/app",
        ["self-hosted", "linux"],
    )
    assert job.created_at.year >= 2020  # when it was heard of instead
    assert WebhookDelivery.objects.count() == 1


def test_hook01_an_infinite_float_timestamp_is_dropped(post, acme):
    body = raw(queued(id=5252)).replace(b'"created_at": "', b'"created_at": 1e999, "x": "')
    status, answer = post(body)
    assert status == 200, answer
    assert Job.objects.get(github_id=5252).created_at.year >= 2020


def test_hook01_an_installation_event_with_a_huge_id_is_refused(post):
    body = raw({"action": "created", "installation": {"id": BIG, "account": {"login": "x"}}})
    status, _answer = post(body, "installation")
    assert status == 400
    assert Installation.objects.count() == 0
