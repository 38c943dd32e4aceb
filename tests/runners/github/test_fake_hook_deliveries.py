"""The fake GitHub's App webhook delivery log over real HTTP (FAKE-02, FAKE-03).

`GET /app/hook/deliveries`, `GET /app/hook/deliveries/{id}` and
`POST /app/hook/deliveries/{id}/attempts`: App JWT only, every attempt listed newest first
with GitHub's status, cursor pages, and a redelivery sent under the same guid.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from runners.github.fake import FakeGitHub
from runners.github.fake.core import REDELIVERY_WINDOW
from tests.runners.github.conftest import (
    WEBHOOK_SECRET,
    GitHubClient,
    MovableClock,
    Recorded,
    SchemaBook,
    WebhookReceiver,
)

LABELS = ["self-hosted", "linux", "x64"]
LIST = "/app/hook/deliveries"


def acme(fake: FakeGitHub) -> int:
    """The acme installation's id, installing it on first use."""
    installed = fake.info()["installations"]
    if installed:
        return int(installed[0]["id"])
    return fake.add_installation("acme", "Organization", ["acme/app"])


def queue(fake: FakeGitHub, count: int = 1) -> list[int]:
    acme(fake)
    return [fake.queue_job(repo="acme/app", labels=LABELS) for _ in range(count)]


def validate(github_schemas: SchemaBook, gh: GitHubClient, method: str, path: str, **kw):
    answer = gh.http.request(method, path, **kw)
    body = answer.json() if answer.content else None
    headers = {k.lower(): v for k, v in answer.headers.items()}
    github_schemas.validate_response(
        Recorded(method, answer.url.path, answer.status_code, headers, body)
    )
    return answer


def test_fake03_the_delivery_routes_answer_in_githubs_shapes(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver, github_schemas: SchemaBook
) -> None:
    """FAKE-03: the list, one delivery, a redelivery's 202 and the errors (unknown id 404,
    a status filter GitHub does not know 422) validate against GitHub's schemas."""
    fake = hooked_gh.fake
    queue(fake, 2)
    fake.wait_deliveries(2)
    app = hooked_gh.app()
    listed = validate(github_schemas, hooked_gh, "GET", LIST, headers=app)
    assert listed.status_code == 200 and len(listed.json()) == 2
    first = listed.json()[0]
    one = validate(github_schemas, hooked_gh, "GET", f"{LIST}/{first['id']}", headers=app)
    assert one.status_code == 200
    body = one.json()
    assert body["guid"] == first["guid"] and body["url"] == webhook_receiver.url
    assert body["request"]["headers"]["X-GitHub-Delivery"] == first["guid"]
    assert body["request"]["payload"]["action"] == "queued"
    assert body["response"]["payload"] == ""  # the receiver answered 202 with no body
    attempt = f"{LIST}/{first['id']}/attempts"
    assert validate(github_schemas, hooked_gh, "POST", attempt, headers=app).status_code == 202
    for method, path, params, status in (
        ("GET", f"{LIST}/1", {}, 404),
        ("POST", f"{LIST}/1/attempts", {}, 404),
        ("GET", LIST, {"status": "sometimes"}, 422),
        ("GET", LIST, {"cursor": "not-a-cursor"}, 422),
    ):
        answer = validate(github_schemas, hooked_gh, method, path, headers=app, params=params)
        assert answer.status_code == status, (method, path, params)


def test_fake03_an_installation_token_is_refused_on_every_delivery_route(
    gh: GitHubClient, github_schemas: SchemaBook
) -> None:
    """FAKE-03: the three routes take the App's JWT only, as GitHub's do: an installation
    token is answered 401, and nothing is redelivered."""
    queue(gh.fake)
    (delivery,) = gh.get(LIST, headers=gh.app()).json()
    token = gh.inst(acme(gh.fake))
    for method, path in (
        ("GET", LIST),
        ("GET", f"{LIST}/{delivery['id']}"),
        ("POST", f"{LIST}/{delivery['id']}/attempts"),
    ):
        answer = validate(github_schemas, gh, method, path, headers=token)
        assert answer.status_code == 401, (method, path)
        assert "JSON web token" in answer.json()["message"]
    assert len(gh.fake.deliveries) == 1


def test_fake02_every_attempt_is_listed_newest_first_with_githubs_status(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: an answered delivery is "OK" with its status code, a 503 is a failure with
    503, a dropped one (GitHub saw no answer) and one whose receiver refused the connection
    are failures with status_code 0; the `failure` filter (400-599) leaves the 0s out."""
    fake = hooked_gh.fake
    queue(fake)
    fake.wait_deliveries(1)
    webhook_receiver.status = 503
    queue(fake)
    fake.wait_deliveries(2)
    fake.set_delivery(drop=True)
    queue(fake)
    fake.set_delivery()
    closed = WebhookReceiver()
    closed.stop()
    fake.webhook_url = closed.url
    queue(fake)
    fake.wait_deliveries(4)
    listed = hooked_gh.get(LIST, headers=hooked_gh.app()).json()
    assert [d["id"] for d in listed] == sorted((d["id"] for d in listed), reverse=True)
    by_guid = {d["guid"]: d for d in listed}
    seen = [by_guid[d["id"]] for d in fake.deliveries]
    assert [(d["status"], d["status_code"]) for d in seen] == [
        ("OK", 202),
        ("Invalid HTTP Response: 503", 503),
        ("timed out", 0),
        ("failed to connect to host", 0),
    ]
    assert {d["event"] for d in seen} == {"workflow_job"}
    assert {d["action"] for d in seen} == {"queued"}
    assert {d["installation_id"] for d in seen} == {acme(fake)}
    assert all(d["redelivery"] is False and d["throttled_at"] is None for d in seen)
    failures = hooked_gh.get(LIST, headers=hooked_gh.app(), params={"status": "failure"}).json()
    assert [d["status_code"] for d in failures] == [503]
    successes = hooked_gh.get(LIST, headers=hooked_gh.app(), params={"status": "success"})
    assert [d["status_code"] for d in successes.json()] == [202]


def test_fake02_the_list_pages_by_cursor_in_the_link_header_at_most_100_a_page(
    gh: GitHubClient,
) -> None:
    """FAKE-02: `per_page` (default 30, at most 100) and a `Link: <...cursor=...>;
    rel="next"` on every page but the last; the pages together list each delivery once."""
    queue(gh.fake, 103)
    app = gh.app()
    first = gh.get(LIST, headers=app)
    assert len(first.json()) == 30
    assert re.search(r'cursor=[^&>]+.*>; rel="next"', first.headers["link"])
    big = gh.get(LIST, headers=app, params={"per_page": 500})
    assert len(big.json()) == 100
    ids: list[int] = []
    answer = gh.get(LIST, headers=app, params={"per_page": 40})
    while True:
        ids += [d["id"] for d in answer.json()]
        following = answer.links.get("next")
        if following is None:
            break
        assert "cursor=" in following["url"] and "per_page=40" in following["url"]
        answer = gh.get(following["url"], headers=app)
    assert len(ids) == len(set(ids)) == 103
    assert ids == sorted(ids, reverse=True)


def test_fake02_a_redelivery_is_sent_under_its_guid_and_listed_as_a_new_item(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: POST .../attempts answers 202; the same body arrives again with the same
    X-GitHub-Delivery, signed, and the list gains an item with `redelivery: true`."""
    fake = hooked_gh.fake
    webhook_receiver.status = 503
    queue(fake)
    (refused,) = fake.wait_deliveries(1)
    webhook_receiver.status = 202
    hook_id = refused["hook_delivery_id"]
    answer = hooked_gh.post(f"{LIST}/{hook_id}/attempts", headers=hooked_gh.app())
    assert answer.status_code == 202 and answer.json() == {}
    original, again = webhook_receiver.wait_for(2)
    assert again.headers["x-github-delivery"] == original.headers["x-github-delivery"]
    assert again.body == original.body
    expected = hmac.new(WEBHOOK_SECRET.encode(), again.body, hashlib.sha256).hexdigest()
    assert again.headers["x-hub-signature-256"] == f"sha256={expected}"
    fake.wait_deliveries(2)
    newest, oldest = hooked_gh.get(LIST, headers=hooked_gh.app()).json()
    assert oldest["id"] == hook_id and oldest["redelivery"] is False
    assert oldest["status_code"] == 503  # the failed attempt stays as it was
    assert newest["guid"] == oldest["guid"] and newest["redelivery"] is True
    assert (newest["status"], newest["status_code"]) == ("OK", 202)
    assert fake.deliveries[-1]["redelivery"] is True


def test_fake02_a_delivery_older_than_the_redelivery_window_is_refused(
    gh: GitHubClient, fake_github_clock: MovableClock
) -> None:
    """FAKE-02: github.com redelivers the past three days only: an older delivery's
    attempt is answered 422 and nothing is sent."""
    queue(gh.fake)
    (delivery,) = gh.get(LIST, headers=gh.app()).json()
    fake_github_clock.advance(REDELIVERY_WINDOW + 1)
    answer = gh.post(f"{LIST}/{delivery['id']}/attempts", headers=gh.app())
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["field"] == "delivered_at"
    assert len(gh.fake.deliveries) == 1


def test_fake02_the_apps_own_calls_can_be_rate_limited(
    gh: GitHubClient, fake_github_clock: MovableClock
) -> None:
    """FAKE-02: `rate_limit_app` limits the App's JWT calls as `rate_limit` does an
    installation's: 403 with x-ratelimit-remaining 0 and the reset, or 429 with
    retry-after; the limit ends on the fake's clock or when cleared."""
    gh.fake.rate_limit_app(reset_in=60)
    limited = gh.get(LIST, headers=gh.app())
    assert limited.status_code == 403
    assert limited.headers["x-ratelimit-remaining"] == "0"
    assert int(limited.headers["x-ratelimit-reset"]) >= int(fake_github_clock()) + 59
    fake_github_clock.advance(61)
    assert gh.get(LIST, headers=gh.app()).status_code == 200
    gh.fake.rate_limit_app(reset_in=None, retry_after=30)
    limited = gh.get(LIST, headers=gh.app())
    assert limited.status_code == 429 and limited.headers["retry-after"] == "30"
    gh.fake.clear_rate_limit_app()
    assert gh.get(LIST, headers=gh.app()).status_code == 200
