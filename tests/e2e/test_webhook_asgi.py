"""`POST /webhooks/github` as the controller serves it: daphne, then runners.webhook_asgi.

zoomies_site/asgi.py routes that one request to a bare ASGI app (its own thread pool, the
same `runners.webhooks.ingest`), not to the Django view that tests/runners/test_webhooks.py
exercises through pytest-django's WSGI live_server. These tests post signed deliveries to a
real controller over its own SQLite file and read the results back through its API, so the
ASGI route is held to the same answers: 200, a duplicate, 401, 400, 413, 405 for a GET.
"""

from __future__ import annotations

import copy
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from runners.webhooks import sign
from tests.e2e.harness import Controller

pytestmark = pytest.mark.e2e

SECRET = "asgi-secret"
INSTALLATION = 4711
MAX_BODY = 64 * 1024  # the registry's smallest cap, so an oversize body stays small
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/github/webhooks/workflow_job.queued.json"


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("webhook-asgi")
    ctl = Controller(
        data_dir,
        env={
            "ZOOMIES_GITHUB_WEBHOOK_SECRETS": SECRET,
            "ZOOMIES_GITHUB_WEBHOOK_MAX_BODY": str(MAX_BODY),
            # No GitHub here: the reconcile passes the deliveries wake must not reach out.
            "ZOOMIES_GITHUB_API_URL": "http://127.0.0.1:9",
        },
    )
    ctl.prepare()
    ctl.manage("add_installation", "--id", str(INSTALLATION), "--account", "acme",
               "--repo", "acme/app")  # fmt: skip
    ctl.start("--no-agent")
    yield ctl
    ctl.stop()


def payload(job_id: int) -> dict:
    data = copy.deepcopy(json.loads(FIXTURE.read_text()))
    data["workflow_job"]["id"] = job_id
    data["workflow_job"]["labels"] = ["self-hosted", "asgi"]
    data["repository"]["full_name"] = "acme/app"
    data["installation"] = {"id": INSTALLATION}
    return data


def signed(body: bytes, *, delivery: str | None = None, event: str = "workflow_job") -> dict:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body, SECRET),
    }


def post(controller: Controller, body, headers) -> httpx.Response:
    return httpx.post(f"{controller.url}/webhooks/github", content=body, headers=headers,
                      timeout=30)  # fmt: skip


def jobs(controller: Controller) -> dict[int, list[dict]]:
    listed: dict[int, list[dict]] = {}
    for job in controller.api("jobs"):
        listed.setdefault(job["github_id"], []).append(job)
    return listed


def deliveries(controller: Controller) -> int:
    """WebhookDelivery rows, counted in the controller's own database."""
    out = controller.manage(
        "shell", "-c",
        "from runners.models import WebhookDelivery; print(WebhookDelivery.objects.count())",
    )  # fmt: skip
    return int(out.splitlines()[-1])


def test_a_signed_delivery_is_recorded_and_a_redelivery_is_a_duplicate(controller):
    body = json.dumps(payload(9_100_001)).encode()
    delivery = str(uuid.uuid4())
    answer = post(controller, body, signed(body, delivery=delivery))
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"ok": True, "delivery": delivery, "event": "workflow_job"}
    (job,) = jobs(controller)[9_100_001]
    assert (job["status"], job["repository"]) == ("queued", "acme/app")

    count = deliveries(controller)
    again = post(controller, body, signed(body, delivery=delivery))
    assert again.status_code == 200, again.text
    assert again.json() == {"duplicate": True, "delivery": delivery}
    assert len(jobs(controller)[9_100_001]) == 1
    assert deliveries(controller) == count


def test_refused_deliveries_answer_as_the_view_does_and_record_nothing(controller):
    before_jobs, before = jobs(controller), deliveries(controller)
    body = json.dumps(payload(9_100_002)).encode()

    bad = signed(body)
    bad["X-Hub-Signature-256"] = "sha256=" + "0" * 64
    answer = post(controller, body, bad)
    assert answer.status_code == 401
    assert answer.json() == {"error": "X-Hub-Signature-256 is not valid for any configured secret"}

    unsigned = signed(body)
    del unsigned["X-Hub-Signature-256"]
    assert post(controller, body, unsigned).json() == {"error": "X-Hub-Signature-256 is missing"}

    # A second signature header spoils a valid first one, as it does in the view (Django
    # joins repeated headers with commas).
    doubled = [*signed(body).items(), ("X-Hub-Signature-256", "sha256=" + "0" * 64)]
    assert post(controller, body, doubled).status_code == 401

    not_json = b"{not json"
    answer = post(controller, not_json, signed(not_json))
    assert answer.status_code == 400
    assert answer.json() == {"error": "the body is not JSON"}

    no_id = payload(9_100_003)
    del no_id["workflow_job"]["id"]
    no_id_body = json.dumps(no_id).encode()
    answer = post(controller, no_id_body, signed(no_id_body))
    assert answer.status_code == 400
    assert answer.json() == {"error": "workflow_job.id is missing or not an integer"}

    no_event = signed(body)
    del no_event["X-GitHub-Event"]
    answer = post(controller, body, no_event)
    assert (answer.status_code, answer.json()) == (400, {"error": "X-GitHub-Event is missing"})

    big = payload(9_100_004)
    big["padding"] = "x" * (MAX_BODY + 1024)
    big_body = json.dumps(big).encode()
    too_large = {"error": f"the delivery is larger than {MAX_BODY} bytes"}
    answer = post(controller, big_body, signed(big_body))  # with a Content-Length
    assert (answer.status_code, answer.json()) == (413, too_large)

    def chunks():  # chunked, without a Content-Length: the read itself stops at the cap
        for start in range(0, len(big_body), 16 * 1024):
            yield big_body[start : start + 16 * 1024]

    answer = post(controller, chunks(), signed(big_body))
    assert (answer.status_code, answer.json()) == (413, too_large)

    assert jobs(controller) == before_jobs
    assert deliveries(controller) == before


def test_other_methods_still_go_to_django(controller):
    answer = httpx.get(f"{controller.url}/webhooks/github", timeout=10)
    assert answer.status_code == 405
    assert answer.headers["allow"] == "POST"


def test_a_delivery_read_in_many_chunks_is_accepted_whole(controller):
    data = payload(9_100_005)
    data["workflow_job"]["steps"] = [{"name": "x" * 1000}] * 50  # about 50 KB, under the cap
    body = json.dumps(data).encode()

    def chunks():
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    answer = post(controller, chunks(), signed(body))
    assert answer.status_code == 200, answer.text
    assert len(jobs(controller)[9_100_005]) == 1


def test_concurrent_deliveries_are_each_recorded_once(controller):
    """Sixteen at a time through the pool: none lost, none doubled, no database error."""
    before = deliveries(controller)
    ids = list(range(9_200_000, 9_200_064))

    def send(job_id: int) -> int:
        body = json.dumps(payload(job_id)).encode()
        return post(controller, body, signed(body)).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(send, ids))
    assert statuses == [200] * len(ids)
    listed = jobs(controller)
    assert all(len(listed.get(job_id, [])) == 1 for job_id in ids)
    assert deliveries(controller) == before + len(ids)
    assert "Traceback" not in controller.log()
