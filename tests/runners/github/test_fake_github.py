"""The fake GitHub over real HTTP: every endpoint, auth, rate limits, runners, deliveries.

FAKE-01 (real server, JIT configs, assignment, signed deliveries), FAKE-02 (rate limits and
delivery faults) and FAKE-03 (every response validates; the walk is the last test here).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from socketserver import BaseRequestHandler
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.management.base import CommandError

from runners.github.fake import FakeGitHub, cli
from runners.github.fake.core import Server
from runners.management.commands.fake_github import Command
from tests.runners.github.conftest import (
    REPO_ROOT,
    RESPONSES,
    WEBHOOK_SECRET,
    GitHubClient,
    MovableClock,
    Recorded,
    SchemaBook,
    WebhookReceiver,
)
from tests.waiting import wait_until

LABELS = ["self-hosted", "linux", "x64"]
# One client for the runner protocol and /_fake calls: a new httpx client costs ~20 ms.
HTTP = httpx.Client(timeout=10)


def org_and_user(fake: FakeGitHub) -> tuple[int, int]:
    org = fake.add_installation("acme", "Organization", ["acme/app", "acme/lib"])
    user = fake.add_installation("mona", "User", ["mona/dotfiles"])
    return org, user


def jit(
    gh: GitHubClient, headers: dict[str, str], scope: str, name: str, labels: list[str] = LABELS
) -> httpx.Response:
    body = {"name": name, "runner_group_id": 1, "labels": labels}
    return gh.post(f"{scope}/actions/runners/generate-jitconfig", headers=headers, json=body)


def decode(encoded: str) -> dict[str, Any]:
    files = json.loads(base64.b64decode(encoded))
    return {name: json.loads(base64.b64decode(body)) for name, body in files.items()}


def go_online(fake: FakeGitHub, encoded: str) -> str:
    """Open the config's one runner session (what the fake runner does first)."""
    files = decode(encoded)
    answer = HTTP.post(
        f"{fake.url}/_runner/sessions",
        json={
            "runner_id": files[".runner"]["AgentId"],
            "secret": files[".credentials"]["data"]["secret"],
            "os": "linux",
            "version": "2.329.0",
        },
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["session"]


def poll(fake: FakeGitHub, session: str, wait: float = 0) -> httpx.Response:
    return HTTP.get(
        f"{fake.url}/_runner/jobs",
        params={"wait": wait},
        headers={"Authorization": f"Bearer {session}"},
        timeout=wait + 5,
    )


def complete(fake: FakeGitHub, session: str, job_id: int, conclusion: str) -> httpx.Response:
    return HTTP.post(
        f"{fake.url}/_runner/jobs/{job_id}/complete",
        json={"conclusion": conclusion},
        headers={"Authorization": f"Bearer {session}"},
    )


def signature(secret: str, body: bytes, digest: Any) -> str:
    return hmac.new(secret.encode(), body, digest).hexdigest()


# ---- FAKE-01: the server itself --------------------------------------------------------


def test_fake01_it_serves_real_http_on_loopback_without_nagle_delays(gh: GitHubClient) -> None:
    """FAKE-01: a real server on 127.0.0.1; keep-alive calls are not held ~40 ms by Nagle:
    every socket it accepts has TCP_NODELAY set (checked on the socket, not with a stopwatch)."""
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", gh.fake.url)
    headers = gh.app()
    for _ in range(3):
        assert gh.get("/app", headers=headers).status_code == 200
    server = Server(("127.0.0.1", 0), BaseRequestHandler)
    try:
        with socket.create_connection(server.server_address, timeout=30):
            accepted, _ = server.get_request()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        server.server_close()


def test_fake01_every_api_response_carries_githubs_headers(gh: GitHubClient) -> None:
    """FAKE-01: JSON content type and the five x-ratelimit headers, success or error."""
    for response in (gh.get("/app", headers=gh.app()), gh.get("/nowhere")):
        assert response.headers["content-type"].startswith("application/json")
        for name in ("limit", "remaining", "used", "reset", "resource"):
            assert f"x-ratelimit-{name}" in response.headers
    assert response.status_code == 404
    assert response.json()["message"] == "Not Found"


def test_fake01_app_and_installations_answer_with_the_app_jwt(gh: GitHubClient) -> None:
    """FAKE-01: GET /app, /app/installations (bare array), one installation, by org, by repo."""
    org, user = org_and_user(gh.fake)
    app = gh.get("/app", headers=gh.app()).json()
    assert app["id"] == gh.fake.app_id and app["installations_count"] == 2
    listed = gh.get("/app/installations", headers=gh.app())
    assert isinstance(listed.json(), list)
    assert [i["id"] for i in listed.json()] == [org, user]
    one = gh.get(f"/app/installations/{user}", headers=gh.app()).json()
    assert one["account"]["login"] == "mona" and one["target_type"] == "User"
    assert gh.get("/app/installations/999", headers=gh.app()).status_code == 404
    assert gh.get("/orgs/ACME/installation", headers=gh.app()).json()["id"] == org
    assert gh.get("/orgs/mona/installation", headers=gh.app()).status_code == 404
    assert gh.get("/repos/mona/dotfiles/installation", headers=gh.app()).json()["id"] == user
    assert gh.get("/repos/acme/nope/installation", headers=gh.app()).status_code == 404


def test_fake01_installation_tokens_expire_after_their_lifetime(
    gh: GitHubClient, fake_github_clock: MovableClock
) -> None:
    """FAKE-01: 201 {token, expires_at, permissions, repository_selection}; 401 once expired."""
    org, _ = org_and_user(gh.fake)
    answer = gh.post(f"/app/installations/{org}/access_tokens", headers=gh.app())
    assert answer.status_code == 201
    body = answer.json()
    assert body["token"].startswith("ghs_") and body["repository_selection"] == "selected"
    assert body["permissions"]["organization_self_hosted_runners"] == "write"
    expected = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(fake_github_clock() + gh.fake.token_lifetime)
    )
    assert abs(_epoch(body["expires_at"]) - _epoch(expected)) <= 1
    headers = {"Authorization": f"token {body['token']}"}
    assert gh.get("/installation/repositories", headers=headers).status_code == 200
    fake_github_clock.advance(gh.fake.token_lifetime + 1)
    expired = gh.get("/installation/repositories", headers=headers)
    assert expired.status_code == 401
    assert expired.json()["message"] == "Bad credentials"
    assert gh.post("/app/installations/999/access_tokens", headers=gh.app()).status_code == 404


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def test_fake01_expire_tokens_and_unknown_tokens_answer_bad_credentials(gh: GitHubClient) -> None:
    """FAKE-01: expire_tokens() invalidates every token issued so far; new ones work."""
    org, _ = org_and_user(gh.fake)
    old = gh.inst(org)
    assert gh.get("/installation/repositories", headers=old).status_code == 200
    gh.fake.expire_tokens()
    answer = gh.get("/installation/repositories", headers=old)
    assert answer.status_code == 401 and answer.json()["message"] == "Bad credentials"
    assert gh.get("/installation/repositories", headers=gh.inst(org)).status_code == 200
    bogus = {"Authorization": "token ghs_notatoken"}
    assert gh.get("/installation/repositories", headers=bogus).status_code == 401
    assert gh.get("/installation/repositories").status_code == 401


def test_fake01_a_narrowed_token_reaches_only_its_repositories(gh: GitHubClient) -> None:
    """FAKE-01: access_tokens {repositories} narrows the token; unknown names answer 422."""
    org, _ = org_and_user(gh.fake)
    narrowed = gh.inst(org, repositories=["app"])
    listed = gh.get("/installation/repositories", headers=narrowed).json()
    assert [r["full_name"] for r in listed["repositories"]] == ["acme/app"]
    assert gh.get("/repos/acme/lib/actions/runs", headers=narrowed).status_code == 404
    refused = gh.post(
        f"/app/installations/{org}/access_tokens",
        headers=gh.app(),
        json={"repositories": ["dotfiles"]},
    )
    assert refused.status_code == 422


@pytest.mark.parametrize(
    "case",
    ["missing", "garbage", "other-key", "wrong-iss", "expired", "too-long", "future-iat", "token"],
)
def test_fake01_app_routes_refuse_a_bad_jwt_with_401(
    gh: GitHubClient, fake_github_clock: MovableClock, case: str
) -> None:
    """FAKE-01: the App JWT is RS256 with the fake's key, iss == app id, exp <= iat + 10 min."""

    org, _ = org_and_user(gh.fake)
    now = int(fake_github_clock())
    if case == "missing":
        headers: dict[str, str] = {}
    elif case == "garbage":
        headers = {"Authorization": "Bearer not.a.jwt"}
    elif case == "other-key":
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = other.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        headers = gh.app(key=pem)
    elif case == "wrong-iss":
        headers = gh.app(iss=str(gh.fake.app_id + 1))
    elif case == "expired":
        headers = gh.app()
        fake_github_clock.advance(541)
    elif case == "too-long":
        headers = gh.app(iat=now - 60, exp=now + 600)
    elif case == "future-iat":
        headers = gh.app(iat=now + 120, exp=now + 300)
    else:
        headers = gh.inst(org)
    for path in ("/app", "/app/installations", f"/app/installations/{org}"):
        answer = gh.get(path, headers=headers)
        assert answer.status_code == 401, (case, path)
        assert answer.json()["documentation_url"]
    assert gh.post(f"/app/installations/{org}/access_tokens", headers=headers).status_code == 401


def test_fake01_a_jwt_is_refused_on_installation_routes(gh: GitHubClient) -> None:
    """FAKE-01: runner and job routes want an installation token, not the App JWT."""
    org_and_user(gh.fake)
    assert gh.get("/orgs/acme/actions/runners", headers=gh.app()).status_code == 401


def test_fake01_installation_repositories_paginate_with_a_link_header(gh: GitHubClient) -> None:
    """FAKE-01: GET /installation/repositories is {total_count, repositories, selection}."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    first = gh.get("/installation/repositories", headers=headers, params={"per_page": 1})
    assert first.json()["total_count"] == 2
    assert [r["full_name"] for r in first.json()["repositories"]] == ["acme/app"]
    assert 'rel="next"' in first.headers["link"] and 'rel="last"' in first.headers["link"]
    nxt = re.search(r'<([^>]+)>; rel="next"', first.headers["link"]).group(1)
    second = gh.get(nxt.removeprefix(gh.fake.url), headers=headers)
    assert [r["full_name"] for r in second.json()["repositories"]] == ["acme/lib"]
    assert 'rel="prev"' in second.headers["link"] and 'rel="next"' not in second.headers["link"]


def test_fake01_an_installation_token_reaches_only_its_own_account(gh: GitHubClient) -> None:
    """FAKE-01: another installation's repos and org answer 404, as GitHub does."""
    org, user = org_and_user(gh.fake)
    mona = gh.inst(user)
    assert gh.get("/repos/acme/app/actions/runs", headers=mona).status_code == 404
    assert gh.get("/orgs/acme/actions/runners", headers=mona).status_code == 404
    # A User installation has no org routes; its runners live on its repositories.
    assert gh.get("/orgs/mona/actions/runners", headers=mona).status_code == 404
    assert jit(gh, mona, "/orgs/mona", "r-1").status_code == 404
    assert jit(gh, mona, "/repos/mona/dotfiles", "r-1").status_code == 201
    assert gh.get("/repos/mona/dotfiles/actions/runners", headers=mona).json()["total_count"] == 1


def test_fake01_rate_limit_endpoint_reports_core_and_is_not_counted(gh: GitHubClient) -> None:
    """FAKE-01: GET /rate_limit {resources.core, rate}; it does not spend the quota."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    gh.get("/installation/repositories", headers=headers)
    first = gh.get("/rate_limit", headers=headers).json()
    second = gh.get("/rate_limit", headers=headers).json()
    assert first["rate"] == first["resources"]["core"]
    assert first["rate"]["used"] == second["rate"]["used"] == 1
    assert first["rate"]["remaining"] == 4999
    assert gh.get("/rate_limit").status_code == 200


def test_fake01_quota_headers_count_each_installation_call(gh: GitHubClient) -> None:
    """FAKE-01: x-ratelimit-used grows by one a call, per installation."""
    org, user = org_and_user(gh.fake)
    acme, mona = gh.inst(org), gh.inst(user)
    used = [
        int(gh.get("/installation/repositories", headers=acme).headers["x-ratelimit-used"])
        for _ in range(3)
    ]
    assert used == [1, 2, 3]
    mona_used = gh.get("/installation/repositories", headers=mona).headers["x-ratelimit-used"]
    assert mona_used == "1"


# ---- FAKE-01: runner registrations -----------------------------------------------------


def test_fake01_jitconfig_registers_one_runner_with_default_and_custom_labels(
    gh: GitHubClient,
) -> None:
    """FAKE-01: 201 {runner, encoded_jit_config}; exactly the labels sent, the default
    names among them read-only in GitHub's spelling, and nothing added, as GitHub does."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    answer = jit(gh, headers, "/orgs/acme", "zoomies-1", ["self-hosted", "linux", "gpu"])
    assert answer.status_code == 201
    runner = answer.json()["runner"]
    labels = [(label["name"], label["type"]) for label in runner["labels"]]
    assert labels == [("self-hosted", "read-only"), ("Linux", "read-only"), ("gpu", "custom")]
    assert runner["status"] == "offline" and runner["busy"] is False and runner["ephemeral"]
    files = decode(answer.json()["encoded_jit_config"])
    assert files[".runner"]["AgentName"] == "zoomies-1"
    assert files[".runner"]["Ephemeral"] is True
    assert files[".runner"]["ServerUrl"] == gh.fake.url
    assert files[".runner"]["AgentId"] == runner["id"]
    assert len(files[".credentials"]["data"]["secret"]) >= 20
    assert [r["id"] for r in gh.fake.runners(org)] == [runner["id"]]
    repo = jit(gh, headers, "/repos/acme/app", "zoomies-2")
    assert repo.status_code == 201
    assert decode(repo.json()["encoded_jit_config"])[".runner"]["AgentName"] == "zoomies-2"


def test_fake01_a_runner_name_can_be_registered_once_per_scope(gh: GitHubClient) -> None:
    """FAKE-01: a taken name answers 409 (case-insensitively); another scope may reuse it."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    assert jit(gh, headers, "/orgs/acme", "zoomies-1").status_code == 201
    taken = jit(gh, headers, "/orgs/acme", "ZOOMIES-1")
    assert taken.status_code == 409 and "already exists" in taken.json()["message"]
    assert jit(gh, headers, "/repos/acme/app", "zoomies-1").status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        {"runner_group_id": 1, "labels": ["x"]},
        {"name": "", "runner_group_id": 1, "labels": ["x"]},
        {"name": "r", "labels": ["x"]},
        {"name": "r", "runner_group_id": "1", "labels": ["x"]},
        {"name": "r", "runner_group_id": 1},
        {"name": "r", "runner_group_id": 1, "labels": []},
        {"name": "r", "runner_group_id": 1, "labels": [f"l{i}" for i in range(101)]},
        {"name": "r", "runner_group_id": 1, "labels": [3]},
        {"name": "r" * 65, "runner_group_id": 1, "labels": ["x"]},
        ["not", "an", "object"],
    ],
)
def test_fake01_jitconfig_refuses_a_bad_body_with_422(gh: GitHubClient, body: Any) -> None:
    """FAKE-01: name, runner_group_id and 1..100 labels are required."""
    org, _ = org_and_user(gh.fake)
    path = "/orgs/acme/actions/runners/generate-jitconfig"
    answer = gh.post(path, headers=gh.inst(org), json=body)
    assert answer.status_code == 422
    assert gh.fake.runners(org) == []


def test_fake01_jitconfig_unknown_group_and_unparsable_json(gh: GitHubClient) -> None:
    """FAKE-01: a group other than Default (1) is 404; a body that is not JSON is 400."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    path = "/orgs/acme/actions/runners/generate-jitconfig"
    body = {"name": "r", "runner_group_id": 7, "labels": ["x"]}
    assert gh.post(path, headers=headers, json=body).status_code == 404
    assert gh.post(path, headers=headers, content=b"{nope").status_code == 400


def test_fake01_a_jit_config_opens_one_session_only(gh: GitHubClient) -> None:
    """FAKE-01: a JIT config is single-use: a second session is refused (409)."""
    org, _ = org_and_user(gh.fake)
    encoded = jit(gh, gh.inst(org), "/orgs/acme", "r-1").json()["encoded_jit_config"]
    go_online(gh.fake, encoded)
    files = decode(encoded)
    again = HTTP.post(
        f"{gh.fake.url}/_runner/sessions",
        json={
            "runner_id": files[".runner"]["AgentId"],
            "secret": files[".credentials"]["data"]["secret"],
        },
    )
    assert again.status_code == 409
    wrong = HTTP.post(
        f"{gh.fake.url}/_runner/sessions",
        json={"runner_id": files[".runner"]["AgentId"], "secret": "guess"},
    )
    assert wrong.status_code == 401


@pytest.mark.parametrize("scope", ["/orgs/acme", "/repos/acme/app"])
def test_fake01_registration_and_remove_tokens(gh: GitHubClient, scope: str) -> None:
    """FAKE-01: the (non-JIT) registration and remove tokens answer 201 {token, expires_at}."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    for kind in ("registration-token", "remove-token"):
        answer = gh.post(f"{scope}/actions/runners/{kind}", headers=headers)
        assert answer.status_code == 201
        assert set(answer.json()) == {"token", "expires_at"}


@pytest.mark.parametrize("scope", ["/orgs/acme", "/repos/acme/app"])
def test_fake01_runner_lists_paginate_and_filter_by_name(gh: GitHubClient, scope: str) -> None:
    """FAKE-01: {total_count, runners}; per_page default 30, max 100; Link next/last/prev."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    for i in range(3):
        assert jit(gh, headers, scope, f"r-{i}").status_code == 201
    path = f"{scope}/actions/runners"
    page1 = gh.get(path, headers=headers, params={"per_page": 2})
    assert page1.json()["total_count"] == 3
    assert [r["name"] for r in page1.json()["runners"]] == ["r-0", "r-1"]
    link = page1.headers["link"]
    assert f'<{gh.fake.url}{path}?per_page=2&page=2>; rel="next"' in link
    assert 'page=2>; rel="last"' in link
    page2 = gh.get(path, headers=headers, params={"per_page": 2, "page": 2})
    assert [r["name"] for r in page2.json()["runners"]] == ["r-2"]
    assert 'rel="prev"' in page2.headers["link"] and 'rel="first"' in page2.headers["link"]
    everything = gh.get(path, headers=headers)
    assert len(everything.json()["runners"]) == 3 and "link" not in everything.headers
    capped = gh.get(path, headers=headers, params={"per_page": 500, "page": 1})
    assert len(capped.json()["runners"]) == 3 and "link" not in capped.headers
    named = gh.get(path, headers=headers, params={"name": "r-1"}).json()
    assert [r["name"] for r in named["runners"]] == ["r-1"]


def test_fake01_per_page_is_capped_at_100(gh: GitHubClient) -> None:
    """FAKE-01: per_page above 100 reads as 100, with a Link to the rest."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    for i in range(101):
        gh.fake.queue_job(repo="acme/app", labels=["nothing-matches"], name=f"j{i}")
    path = "/repos/acme/app/actions/runs"
    answer = gh.get(path, headers=headers, params={"per_page": 1000})
    assert len(answer.json()["workflow_runs"]) == 100
    assert answer.json()["total_count"] == 101
    assert 'per_page=100&page=2>; rel="next"' in answer.headers["link"]
    default = gh.get(path, headers=headers)
    assert len(default.json()["workflow_runs"]) == 30


@pytest.mark.parametrize("scope", ["/orgs/acme", "/repos/acme/app"])
def test_fake01_get_and_delete_a_runner(gh: GitHubClient, scope: str) -> None:
    """FAKE-01: GET and DELETE .../runners/{id}: 204 then 404; an idle runner's poll ends."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    answer = jit(gh, headers, scope, "r-1")
    runner_id = answer.json()["runner"]["id"]
    session = go_online(gh.fake, answer.json()["encoded_jit_config"])
    got = gh.get(f"{scope}/actions/runners/{runner_id}", headers=headers)
    assert got.json()["status"] == "online" and got.json()["busy"] is False
    if scope == "/orgs/acme":
        labels = gh.get(f"{scope}/actions/runners/{runner_id}/labels", headers=headers).json()
        assert labels["total_count"] == 3
    assert gh.delete(f"{scope}/actions/runners/{runner_id}", headers=headers).status_code == 204
    assert gh.get(f"{scope}/actions/runners/{runner_id}", headers=headers).status_code == 404
    assert gh.delete(f"{scope}/actions/runners/{runner_id}", headers=headers).status_code == 404
    assert gh.get(f"{scope}/actions/runners/nope", headers=headers).status_code == 404
    assert poll(gh.fake, session).status_code == 404


def test_fake01_an_org_runner_is_not_visible_on_a_repo_route(gh: GitHubClient) -> None:
    """FAKE-01: org-level and repo-level runners are separate lists, as on GitHub."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    runner_id = jit(gh, headers, "/orgs/acme", "r-1").json()["runner"]["id"]
    path = f"/repos/acme/app/actions/runners/{runner_id}"
    assert gh.get(path, headers=headers).status_code == 404


def test_fake01_deleting_a_busy_runner_answers_422(gh: GitHubClient) -> None:
    """FAKE-01: a busy runner cannot be deleted, like GitHub's 'still running a job'."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    answer = jit(gh, headers, "/orgs/acme", "busy-1")
    runner_id = answer.json()["runner"]["id"]
    session = go_online(gh.fake, answer.json()["encoded_jit_config"])
    job_id = gh.fake.queue_job(repo="acme/app", labels=LABELS, duration=0)
    assert gh.fake.job(job_id)["runner_id"] == runner_id
    refused = gh.delete(f"/orgs/acme/actions/runners/{runner_id}", headers=headers)
    assert refused.status_code == 422
    assert refused.json()["message"].startswith('Bad request - Runner "busy-1" is still running')
    assert gh.fake.runners(org)[0]["busy"] is True
    assert poll(gh.fake, session).json()["job"]["id"] == job_id
    assert complete(gh.fake, session, job_id, "success").status_code == 200
    # The ephemeral runner is de-registered after its job, like GitHub does.
    assert gh.get(f"/orgs/acme/actions/runners/{runner_id}", headers=headers).status_code == 404


def test_fake01_runner_groups_list_the_default_group(gh: GitHubClient) -> None:
    """FAKE-01: GET /orgs/{org}/actions/runner-groups has Default, id 1."""
    org, _ = org_and_user(gh.fake)
    groups = gh.get("/orgs/acme/actions/runner-groups", headers=gh.inst(org)).json()
    assert groups["total_count"] == 1
    assert groups["runner_groups"][0]["id"] == 1
    assert groups["runner_groups"][0]["name"] == "Default"


# ---- FAKE-01: runs, jobs and assignment ------------------------------------------------


def test_fake01_runs_and_jobs_follow_the_job_through_its_life(gh: GitHubClient) -> None:
    """FAKE-01: runs filter by status; run, run jobs and job answer with GitHub's shapes."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    job_id = gh.fake.queue_job(repo="acme/app", labels=LABELS, duration=0.2)
    job = gh.fake.job(job_id)
    assert job["status"] == "queued" and job["runner_id"] is None
    run_id = job["run_id"]
    runs = "/repos/acme/app/actions/runs"

    def statuses(status: str) -> list[int]:
        answer = gh.get(runs, headers=headers, params={"status": status}).json()
        return [r["id"] for r in answer["workflow_runs"]]

    assert statuses("queued") == [run_id] and statuses("completed") == []
    answer = jit(gh, headers, "/orgs/acme", "r-1")
    session = go_online(gh.fake, answer.json()["encoded_jit_config"])
    assert statuses("in_progress") == [run_id]
    running = gh.get(f"/repos/acme/app/actions/jobs/{job_id}", headers=headers).json()
    assert running["status"] == "in_progress" and running["runner_name"] == "r-1"
    assert running["runner_group_id"] == 1 and running["runner_group_name"] == "Default"
    complete(gh.fake, session, job_id, "failure")
    assert statuses("completed") == [run_id] and statuses("failure") == [run_id]
    run = gh.get(f"{runs}/{run_id}", headers=headers).json()
    assert run["status"] == "completed" and run["conclusion"] == "failure"
    jobs = gh.get(f"{runs}/{run_id}/jobs", headers=headers).json()
    assert jobs["total_count"] == 1 and jobs["jobs"][0]["conclusion"] == "failure"
    assert gh.get(f"{runs}/{run_id}", headers=gh.inst(org, repositories=["lib"])).status_code == 404
    assert gh.get("/repos/acme/lib/actions/jobs/" + str(job_id), headers=headers).status_code == 404
    assert gh.get(f"{runs}/123", headers=headers).status_code == 404


def test_fake01_a_job_goes_to_any_online_idle_runner_whose_labels_match(
    fake_github: FakeGitHub,
) -> None:
    """FAKE-01: labels match case-insensitively as a subset; any matching runner may take it."""
    gh = GitHubClient(fake_github)
    org, user = org_and_user(fake_github)
    headers = gh.inst(org)
    gpu = go_online(
        fake_github,
        jit(gh, headers, "/orgs/acme", "gpu", ["self-hosted", "gpu"]).json()["encoded_jit_config"],
    )
    plain = go_online(
        fake_github, jit(gh, headers, "/orgs/acme", "plain").json()["encoded_jit_config"]
    )
    for_app = go_online(
        fake_github, jit(gh, headers, "/repos/acme/app", "app-only").json()["encoded_jit_config"]
    )
    user_runner = go_online(
        fake_github,
        jit(gh, gh.inst(user), "/repos/mona/dotfiles", "mona").json()["encoded_jit_config"],
    )
    # Only "gpu" has the gpu label.
    wanted_gpu = fake_github.queue_job(repo="acme/lib", labels=["Self-Hosted", "GPU"])
    assert fake_github.job(wanted_gpu)["runner_name"] == "gpu"
    # The repo-level runner of acme/app does not serve acme/lib; "plain" does.
    lib = fake_github.queue_job(repo="acme/lib", labels=["self-hosted", "LINUX"])
    assert fake_github.job(lib)["runner_name"] == "plain"
    # Nothing idle matches now: the job waits for a runner of the right installation.
    nothing = fake_github.queue_job(repo="acme/lib", labels=["self-hosted", "windows"])
    assert fake_github.job(nothing)["status"] == "queued"
    app = fake_github.queue_job(repo="acme/app", labels=["self-hosted"])
    assert fake_github.job(app)["runner_name"] == "app-only"
    assert fake_github.job(nothing)["status"] == "queued"
    for session in (gpu, plain, for_app):
        assert poll(fake_github, session).status_code == 200
    assert poll(fake_github, user_runner).status_code == 204
    gh.close()


def test_fake01_a_runner_that_comes_online_later_takes_the_oldest_job(
    fake_github: FakeGitHub,
) -> None:
    """FAKE-01: a job queued with no runner waits; a long-poll is answered as it is handed."""
    gh = GitHubClient(fake_github)
    org, _ = org_and_user(fake_github)
    first = fake_github.queue_job(repo="acme/app", labels=LABELS)
    second = fake_github.queue_job(repo="acme/app", labels=LABELS)
    encoded = jit(gh, gh.inst(org), "/orgs/acme", "late").json()["encoded_jit_config"]
    session = go_online(fake_github, encoded)
    assert poll(fake_github, session).json()["job"]["id"] == first
    assert fake_github.job(second)["status"] == "queued"
    # A long-poll returns as soon as a job is handed, not after the wait.
    encoded = jit(gh, gh.inst(org), "/orgs/acme", "waiter").json()["encoded_jit_config"]
    waiter = go_online(fake_github, encoded)
    assert fake_github.job(second)["runner_name"] == "waiter"
    fake_github.cancel_job(fake_github.queue_job(repo="acme/app", labels=["absent"]))
    third = fake_github.queue_job(repo="acme/app", labels=LABELS)
    poll(fake_github, waiter)  # takes `second`
    complete(fake_github, waiter, second, "success")
    encoded = jit(gh, gh.inst(org), "/orgs/acme", "fresh").json()["encoded_jit_config"]
    fresh = go_online(fake_github, encoded)
    # A poll held for its whole wait would outlast the client's 30 s timeout and fail.
    answer = HTTP.get(
        f"{fake_github.url}/_runner/jobs",
        params={"wait": 600},
        headers={"Authorization": f"Bearer {fresh}"},
        timeout=30,
    )
    assert answer.json()["job"]["id"] == third
    gh.close()


def test_fake01_a_long_poll_is_held_for_a_job_and_answers_204_when_none_came(
    fake_github: FakeGitHub, fake_github_clock: MovableClock
) -> None:
    """FAKE-01: a poll is held up to `wait` seconds: a job queued while it waits is its
    answer, and a poll whose wait ends with no job answers 204."""
    gh = GitHubClient(fake_github)
    org, _ = org_and_user(fake_github)
    headers = gh.inst(org)
    registered = jit(gh, headers, "/orgs/acme", "r").json()
    session = go_online(fake_github, registered["encoded_jit_config"])
    path = f"/orgs/acme/actions/runners/{registered['runner']['id']}"
    # Once it has not been seen for `offline_after`, the runner is online only while a poll of
    # it is held: that is how this test sees the hold begin, without timing anything.
    fake_github_clock.advance(fake_github.offline_after + 1)
    assert gh.get(path, headers=headers).json()["status"] == "offline"
    answers: list[httpx.Response] = []
    held = threading.Thread(target=lambda: answers.append(poll(fake_github, session, wait=30)))
    held.start()
    wait_until(lambda: gh.get(path, headers=headers).json()["status"] == "online", what="a hold")
    job_id = fake_github.queue_job(repo="acme/app", labels=LABELS)
    held.join(timeout=35)
    assert answers[0].status_code == 200 and answers[0].json()["job"]["id"] == job_id
    other = jit(gh, headers, "/orgs/acme", "r-2").json()["encoded_jit_config"]
    assert poll(fake_github, go_online(fake_github, other), wait=0.2).status_code == 204
    gh.close()


def test_fake01_cancel_a_queued_job(fake_github: FakeGitHub) -> None:
    """FAKE-01: a cancelled queued job completes as cancelled with no runner."""
    org_and_user(fake_github)
    job_id = fake_github.queue_job(repo="acme/app", labels=LABELS)
    job = fake_github.cancel_job(job_id)
    assert (job["status"], job["conclusion"], job["runner_id"]) == ("completed", "cancelled", None)
    with pytest.raises(ValueError):
        fake_github.cancel_job(job_id)
    with pytest.raises(ValueError):
        fake_github.queue_job(repo="acme/unknown", labels=LABELS)


def test_fake01_calls_are_logged_with_their_installation(gh: GitHubClient) -> None:
    """FAKE-01: fake.calls lists (method, path, installation id or None) of API calls."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    gh.get("/orgs/acme/actions/runners", headers=headers)
    gh.get("/orgs/acme/actions/runners", headers={"Authorization": "token bad"})
    assert gh.fake.calls == [
        ("POST", f"/app/installations/{org}/access_tokens", None),
        ("GET", "/orgs/acme/actions/runners", org),
        ("GET", "/orgs/acme/actions/runners", None),
    ]


# ---- FAKE-02: rate limits --------------------------------------------------------------


def test_fake02_primary_rate_limit_answers_403_until_the_reset(
    gh: GitHubClient, fake_github_clock: MovableClock
) -> None:
    """FAKE-02: 403, x-ratelimit-remaining 0 and the reset; other callers are unaffected."""
    org, user = org_and_user(gh.fake)
    acme, mona = gh.inst(org), gh.inst(user)
    gh.fake.rate_limit(org, reset_in=120)
    limited = gh.get("/orgs/acme/actions/runners", headers=acme)
    assert limited.status_code == 403
    assert limited.headers["x-ratelimit-remaining"] == "0"
    assert int(limited.headers["x-ratelimit-reset"]) == math.ceil(fake_github_clock() + 120)
    assert "rate limit" in limited.json()["message"]
    assert "retry-after" not in limited.headers
    assert gh.get("/rate_limit", headers=acme).json()["rate"]["remaining"] == 0
    assert gh.get("/installation/repositories", headers=mona).status_code == 200
    assert gh.get("/app", headers=gh.app()).status_code == 200
    fake_github_clock.advance(121)
    assert gh.get("/orgs/acme/actions/runners", headers=acme).status_code == 200


def test_fake02_secondary_rate_limit_answers_429_with_retry_after(
    gh: GitHubClient, fake_github_clock: MovableClock
) -> None:
    """FAKE-02: 429 with retry-after N; it lifts once the clock passes."""
    org, _ = org_and_user(gh.fake)
    acme = gh.inst(org)
    gh.fake.rate_limit(org, reset_in=None, retry_after=30)
    limited = gh.get("/repos/acme/app/actions/runs", headers=acme)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "30"
    assert limited.headers["x-ratelimit-remaining"] != "0"
    fake_github_clock.advance(31)
    assert gh.get("/repos/acme/app/actions/runs", headers=acme).status_code == 200


def test_fake02_a_rate_limit_that_says_nothing_until_cleared(
    gh: GitHubClient, fake_github_clock: MovableClock
) -> None:
    """FAKE-02: 403 with no retry-after, no reset and remaining not 0; clear lifts it."""
    org, _ = org_and_user(gh.fake)
    acme = gh.inst(org)
    gh.fake.rate_limit(org, reset_in=None, retry_after=None)
    fake_github_clock.advance(7200)
    acme = gh.inst(org)
    limited = gh.get("/orgs/acme/actions/runners", headers=acme)
    assert limited.status_code == 403
    assert "retry-after" not in limited.headers
    assert "x-ratelimit-reset" not in limited.headers
    assert limited.headers["x-ratelimit-remaining"] != "0"
    gh.fake.clear_rate_limit(org)
    assert gh.get("/orgs/acme/actions/runners", headers=acme).status_code == 200


def test_fake02_rate_limits_over_http_control(gh: GitHubClient) -> None:
    """FAKE-02: POST /_fake/rate_limit sets and clears the same limits."""
    org, _ = org_and_user(gh.fake)
    acme = gh.inst(org)
    control = f"{gh.fake.url}/_fake/rate_limit"
    assert HTTP.post(control, json={"installation_id": org, "retry_after": 5}).status_code == 200
    assert gh.get("/installation/repositories", headers=acme).status_code == 429
    assert HTTP.post(control, json={"installation_id": org, "clear": True}).status_code == 200
    assert gh.get("/installation/repositories", headers=acme).status_code == 200


# ---- FAKE-01/02: deliveries ------------------------------------------------------------


def run_one_job(fake: FakeGitHub, gh: GitHubClient, conclusion: str = "success") -> int:
    """Queue a job on acme/app, let an online runner take it and complete it."""
    headers = gh.inst(fake.add_installation("acme", "Organization", ["acme/app"]))
    session = go_online(fake, jit(gh, headers, "/orgs/acme", "r-1").json()["encoded_jit_config"])
    job_id = fake.queue_job(repo="acme/app", labels=LABELS, conclusion=conclusion)
    assert poll(fake, session).json()["job"]["conclusion"] == conclusion
    assert complete(fake, session, job_id, conclusion).json() == {"runner_removed": True}
    return job_id


def test_fake01_deliveries_are_signed_workflow_job_posts(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver, github_schemas: SchemaBook
) -> None:
    """FAKE-01: queued, in_progress, completed; HMAC-SHA256 (and SHA-1) of the raw body."""
    fake = hooked_gh.fake
    job_id = run_one_job(fake, hooked_gh, "failure")
    received = webhook_receiver.wait_for(3)
    payloads = [r.json() for r in received]
    assert [p["action"] for p in payloads] == ["queued", "in_progress", "completed"]
    for item, payload in zip(received, payloads, strict=True):
        headers = item.headers
        expected = signature(WEBHOOK_SECRET, item.body, hashlib.sha256)
        assert hmac.compare_digest(headers["x-hub-signature-256"], f"sha256={expected}")
        assert headers["x-hub-signature"] == "sha1=" + signature(
            WEBHOOK_SECRET, item.body, hashlib.sha1
        )
        assert headers["x-github-event"] == "workflow_job"
        assert uuid.UUID(headers["x-github-delivery"])
        assert headers["user-agent"].startswith("GitHub-Hookshot/")
        assert headers["content-type"] == "application/json"
        assert headers["x-github-hook-id"] == str(fake.hook_id)
        assert headers["x-github-hook-installation-target-id"] == str(fake.app_id)
        assert headers["x-github-hook-installation-target-type"] == "integration"
        github_schemas.validate_webhook(payload)
        assert payload["workflow_job"]["id"] == job_id
        assert payload["installation"]["id"] and payload["installation"]["node_id"]
        assert payload["organization"]["login"] == "acme"
        assert payload["repository"]["full_name"] == "acme/app"
        assert payload["sender"]["login"]
    queued, started, done = (p["workflow_job"] for p in payloads)
    assert queued["status"] == "queued" and queued["runner_id"] is None
    assert started["status"] == "in_progress" and started["runner_name"] == "r-1"
    assert started["runner_group_id"] == 1 and started["runner_group_name"] == "Default"
    assert started["started_at"] and started["conclusion"] is None
    assert done["status"] == "completed" and done["conclusion"] == "failure"
    ids = [d["id"] for d in fake.wait_deliveries(3)]
    assert ids == [r.headers["x-github-delivery"] for r in received]
    assert [d["status_code"] for d in fake.deliveries] == [202, 202, 202]


def test_fake01_a_user_installation_delivery_has_no_organization(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver, github_schemas: SchemaBook
) -> None:
    """FAKE-01: the `organization` key appears only for organization installations."""
    hooked_github.add_installation("mona", "User", ["mona/dotfiles"])
    hooked_github.queue_job(repo="mona/dotfiles", labels=LABELS)
    payload = webhook_receiver.wait_for(1)[0].json()
    github_schemas.validate_webhook(payload)
    assert "organization" not in payload
    assert payload["repository"]["owner"]["type"] == "User"


def test_fake02_dropped_deliveries_are_recorded_and_never_sent(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: drop=True records each delivery with status_code None and sends nothing."""
    hooked_gh.fake.set_delivery(drop=True)
    run_one_job(hooked_gh.fake, hooked_gh)
    deliveries = hooked_gh.fake.wait_deliveries(3)
    assert [d["status_code"] for d in deliveries] == [None, None, None]
    assert [d["action"] for d in deliveries] == ["queued", "in_progress", "completed"]
    # One sender thread sends in order: once a later, undropped delivery has landed, any
    # dropped one sent by mistake would have landed before it.
    hooked_gh.fake.set_delivery()
    marker = hooked_gh.fake.queue_job(repo="acme/app", labels=LABELS)
    (only,) = webhook_receiver.wait_for(1, timeout=30)
    assert only.json()["workflow_job"]["id"] == marker


def test_fake02_duplicated_deliveries_share_their_delivery_id(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: duplicate=True sends each delivery twice with the same X-GitHub-Delivery."""
    hooked_gh.fake.set_delivery(duplicate=True)
    run_one_job(hooked_gh.fake, hooked_gh)
    received = webhook_receiver.wait_for(6)
    ids = [r.headers["x-github-delivery"] for r in received]
    assert len(set(ids)) == 3
    assert all(ids.count(i) == 2 for i in ids)
    assert [r.body for r in received[0::2]] == [r.body for r in received[1::2]]
    assert len(hooked_gh.fake.wait_deliveries(6)) == 6


def test_fake02_reordered_deliveries_arrive_completed_first(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: reorder=True holds a job's deliveries and sends them newest first."""
    hooked_gh.fake.set_delivery(reorder=True)
    run_one_job(hooked_gh.fake, hooked_gh)
    actions = [r.json()["action"] for r in webhook_receiver.wait_for(3)]
    assert actions == ["completed", "in_progress", "queued"]


def test_fake02_delayed_deliveries_wait_before_they_are_sent(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: delay=S holds each delivery S seconds (real time: it stands for latency)."""
    hooked_github.set_delivery(delay=0.3)
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    queued_at = time.monotonic()
    hooked_github.queue_job(repo="acme/app", labels=LABELS)
    arrived = webhook_receiver.wait_for(1, timeout=30)[0].at
    # A lower bound only: the delay is honoured (how promptly it ends is no test's business).
    assert arrived - queued_at >= 0.3


def test_fake02_a_failed_delivery_is_not_retried(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: a 500 from the receiver is recorded once; GitHub does not redeliver."""
    webhook_receiver.status = 500
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    hooked_github.queue_job(repo="acme/app", labels=LABELS)
    assert hooked_github.wait_deliveries(1)[0]["status_code"] == 500
    # One sender thread sends in order: a retry queued with the failure lands before this.
    webhook_receiver.status = 202
    marker = hooked_github.queue_job(repo="acme/app", labels=LABELS)
    received = webhook_receiver.wait_for(2, timeout=30)
    assert len(received) == 2 and received[1].json()["workflow_job"]["id"] == marker
    assert [d["status_code"] for d in hooked_github.wait_deliveries(2)] == [500, 202]


def test_fake02_an_unreachable_receiver_or_no_url_records_no_status(
    fake_github: FakeGitHub,
) -> None:
    """FAKE-02: webhook_url None records dropped deliveries; a refused connection, None too."""
    fake_github.add_installation("acme", "Organization", ["acme/app"])
    fake_github.queue_job(repo="acme/app", labels=LABELS)
    assert fake_github.deliveries[0]["status_code"] is None
    closed = WebhookReceiver()
    closed.stop()
    fake_github.webhook_url = closed.url
    fake_github.queue_job(repo="acme/app", labels=LABELS)
    delivery = fake_github.wait_deliveries(2)[1]
    assert delivery["status_code"] is None and delivery["error"]


def test_fake02_delivery_modes_over_http_control(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: POST /_fake/delivery sets the same modes as set_delivery()."""
    answer = HTTP.post(f"{hooked_github.url}/_fake/delivery", json={"drop": True})
    assert answer.json()["drop"] is True
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    hooked_github.queue_job(repo="acme/app", labels=LABELS)
    assert hooked_github.deliveries[0]["status_code"] is None
    HTTP.post(f"{hooked_github.url}/_fake/delivery", json={})
    hooked_github.queue_job(repo="acme/app", labels=LABELS)
    assert webhook_receiver.wait_for(1)[0].json()["action"] == "queued"


def test_fake02_duplicate_without_reorder_sends_queued_twice_while_the_job_is_queued(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02, HOOK-02: duplicate=True alone sends both `queued` copies at once, not held."""
    hooked_github.set_delivery(duplicate=True)
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    job_id = hooked_github.queue_job(repo="acme/app", labels=LABELS)
    received = webhook_receiver.wait_for(2, timeout=30)
    assert [r.json()["action"] for r in received] == ["queued", "queued"]
    assert received[0].headers["x-github-delivery"] == received[1].headers["x-github-delivery"]
    # No runner is online: both copies landed while the job was still queued.
    assert hooked_github.job(job_id)["status"] == "queued"


def test_fake02_duplicate_with_new_ids_sends_the_same_event_under_two_delivery_ids(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02, HOOK-03: new_ids gives the second copy its own X-GitHub-Delivery."""
    hooked_gh.fake.set_delivery(duplicate=True, new_ids=True)
    run_one_job(hooked_gh.fake, hooked_gh)
    received = webhook_receiver.wait_for(6)
    assert [r.json()["action"] for r in received] == [
        "queued", "queued", "in_progress", "in_progress", "completed", "completed",
    ]  # fmt: skip
    ids = [r.headers["x-github-delivery"] for r in received]
    assert len(set(ids)) == 6
    assert [r.body for r in received[0::2]] == [r.body for r in received[1::2]]
    recorded = [d["id"] for d in hooked_gh.fake.wait_deliveries(6)]
    assert sorted(recorded) == sorted(ids)


def test_fake02_early_progress_holds_queued_until_the_job_starts(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02, HOOK-03: early_progress sends in_progress first, then the late queued, both
    while the job is still running; nothing goes out while the job waits for a runner."""
    fake = hooked_gh.fake
    fake.set_delivery(early_progress=True)
    headers = hooked_gh.inst(fake.add_installation("acme", "Organization", ["acme/app"]))
    job_id = fake.queue_job(repo="acme/app", labels=LABELS)
    # A marker job cancelled while queued has its deliveries let go at once; one sender thread
    # sends in order, so a queued of the first job sent too soon would land before them.
    marker = fake.queue_job(repo="acme/app", labels=["absent"])
    fake.cancel_job(marker)
    first = webhook_receiver.wait_for(2, timeout=30)
    assert {r.json()["workflow_job"]["id"] for r in first} == {marker}
    assert {d["job_id"] for d in fake.wait_deliveries(2)} == {marker}
    session = go_online(
        fake, jit(hooked_gh, headers, "/orgs/acme", "r-1").json()["encoded_jit_config"]
    )
    assert poll(fake, session).json()["job"]["id"] == job_id
    received = webhook_receiver.wait_for(4, timeout=30)[2:]
    assert [r.json()["action"] for r in received] == ["in_progress", "queued"]
    assert received[1].json()["workflow_job"]["status"] == "queued"
    assert fake.job(job_id)["status"] == "in_progress"  # queued arrived while the job ran
    assert complete(fake, session, job_id, "success").status_code == 200
    received = webhook_receiver.wait_for(5, timeout=30)[2:]
    assert [r.json()["action"] for r in received] == ["in_progress", "queued", "completed"]
    assert len({r.headers["x-github-delivery"] for r in received}) == 3


def test_fake02_early_progress_with_a_runner_waiting_still_sends_in_progress_first(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: a job taken at once by an idle runner still delivers in_progress before
    queued; with duplicate each of them comes twice, in that order."""
    fake = hooked_gh.fake
    fake.set_delivery(early_progress=True, duplicate=True)
    run_one_job(fake, hooked_gh)
    actions = [r.json()["action"] for r in webhook_receiver.wait_for(6)]
    assert actions == [
        "in_progress", "in_progress", "queued", "queued", "completed", "completed",
    ]  # fmt: skip


def test_fake02_early_progress_with_a_queued_lag_sends_queued_that_much_later(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: queued_lag=S sends the held queued S seconds after in_progress; a job that
    ends within the lag sends completed first, and the queued after it."""
    fake = hooked_gh.fake
    fake.set_delivery(early_progress=True, queued_lag=0.4)
    job_id = run_one_job(fake, hooked_gh)
    received = webhook_receiver.wait_for(3)
    # The order is the proof: the queued was held past the completed that followed at once.
    # (Arrival times are not: a loaded sender can deliver in_progress late, shrinking the gap.)
    assert [r.json()["action"] for r in received] == ["in_progress", "completed", "queued"]
    assert received[2].json()["workflow_job"]["id"] == job_id


def test_fake02_early_progress_sends_a_cancelled_jobs_queued_after_completed(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: a job cancelled while queued never starts; its held queued follows completed."""
    hooked_github.set_delivery(early_progress=True)
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    job_id = hooked_github.queue_job(repo="acme/app", labels=LABELS)
    hooked_github.set_delivery()  # switching the mode off does not strand the held queued
    hooked_github.cancel_job(job_id)
    received = webhook_receiver.wait_for(2)
    assert [r.json()["action"] for r in received] == ["completed", "queued"]
    assert received[0].json()["workflow_job"]["conclusion"] == "cancelled"


def test_fake02_early_progress_and_new_ids_over_http_control(hooked_github: FakeGitHub) -> None:
    """FAKE-02: POST /_fake/delivery takes early_progress and new_ids too."""
    answer = HTTP.post(
        f"{hooked_github.url}/_fake/delivery",
        json={"early_progress": True, "duplicate": True, "new_ids": True},
    ).json()
    assert answer == {
        "drop": False,
        "duplicate": True,
        "new_ids": True,
        "reorder": False,
        "early_progress": True,
        "queued_lag": 0.0,
        "delay": 0.0,
        "concurrency": 1,
        "seed": None,
    }


def queue_and_cancel(fake: FakeGitHub, count: int) -> list[int]:
    """Jobs that each make two deliveries at once, `queued` then `completed` (cancelled
    while queued): a burst of deliveries with no runner to wait for."""
    jobs = []
    for _ in range(count):
        jobs.append(fake.queue_job(repo="acme/app", labels=["absent"]))
        fake.cancel_job(jobs[-1])
    return jobs


def faults_by_job(jobs: list[int], records: list[dict[str, Any]]) -> list[list[str]]:
    """For each job in turn, what became of each of its deliveries, in the order made."""
    made = {job: i for i, job in enumerate(jobs)}
    out: list[list[str]] = [[] for _ in jobs]
    for record in sorted(records, key=lambda d: d["hook_delivery_id"]):
        if record["job_id"] in made:
            out[made[record["job_id"]]].append(f"{record['action']} {record['error']}")
    return [sorted(items) for items in out]


def test_fake02_drop_and_duplicate_at_a_share_honour_it_with_a_seed(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: drop=0.2 and duplicate=0.3 drop a fifth of 400 deliveries and send 3 in 10
    of the rest twice, as counted by the fake, its control record, GitHub's delivery log
    (each dropped one a failed attempt, as GitHub shows it) and the receiver; the switches
    are shares 1.0, and the same seed gives the same pattern."""
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    hooked_github.set_delivery(drop=0.2, duplicate=0.3, seed=1107)
    jobs = queue_and_cancel(hooked_github, 200)
    faults = hooked_github.delivery_faults
    sent = 400 - faults["dropped"]
    received = webhook_receiver.wait_for(sent + faults["duplicated"])
    # Seeded, so these are fixed counts (91 of 400 dropped, 89 of the 309 sent twice), each
    # within 5 points of its share: what a binomial draw of this size stays inside.
    assert abs(faults["dropped"] / 400 - 0.2) <= 0.05, faults
    assert abs(faults["duplicated"] / sent - 0.3) <= 0.05, faults
    assert faults["redeliveries_dropped"] == faults["reordered_jobs"] == 0
    records = hooked_github.wait_deliveries(400 + faults["duplicated"])
    dropped = [d for d in records if d["error"] == "dropped"]
    assert len(dropped) == faults["dropped"]
    assert all(d["status_code"] is None for d in dropped)
    log = {h["guid"]: h for h in hooked_github.hook_deliveries if h["status"] != "OK"}
    assert sorted(log) == sorted(d["id"] for d in dropped)
    assert {(h["status"], h["status_code"]) for h in log.values()} == {("timed out", 0)}
    ids = [r.headers["x-github-delivery"] for r in received]
    assert len(ids) == sent + faults["duplicated"]
    assert sum(ids.count(i) == 2 for i in set(ids)) == faults["duplicated"]
    assert not set(ids) & set(log)
    # The same seed again gives the same faults to the same jobs' same deliveries.
    first = faults_by_job(jobs, records)
    hooked_github.set_delivery(drop=0.2, duplicate=0.3, seed=1107)
    again = queue_and_cancel(hooked_github, 200)
    assert faults_by_job(again, hooked_github.wait_deliveries(2 * len(records))) == first
    # A switch is a share of 1.0: every delivery, and no draw made.
    hooked_github.set_delivery(drop=True)
    queue_and_cancel(hooked_github, 5)
    assert hooked_github.delivery_faults["dropped"] == 2 * faults["dropped"] + 10


def test_fake02_reorder_at_a_share_holds_that_share_of_jobs_and_sends_the_rest_in_order(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: reorder=0.3 holds the deliveries of 3 jobs in 10 (drawn once per job) and
    sends them newest first when the job completes; every other job's go out in order."""
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    hooked_github.set_delivery(reorder=0.3, seed=1107)
    jobs = queue_and_cancel(hooked_github, 200)
    received = webhook_receiver.wait_for(400)
    order: dict[int, list[str]] = {}
    for item in received:
        payload = item.json()
        order.setdefault(payload["workflow_job"]["id"], []).append(payload["action"])
    newest_first = [j for j in jobs if order[j] == ["completed", "queued"]]
    in_order = [j for j in jobs if order[j] == ["queued", "completed"]]
    reordered = hooked_github.delivery_faults["reordered_jobs"]
    assert len(newest_first) == reordered and len(in_order) == 200 - reordered
    assert abs(reordered / 200 - 0.3) <= 0.07, reordered  # seeded: a fixed count


def test_fake02_delivery_shares_and_seed_over_http_control_and_the_command_line(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: POST /_fake/delivery takes shares and a seed (and refuses a share out of
    0..1), GET /_fake/delivery answers the modes and the faults made; the command line and
    the management command take --drop, --duplicate, --reorder, --new-ids, --delivery-seed."""
    base = f"{hooked_github.url}/_fake/delivery"
    answer = HTTP.post(base, json={"drop": 0.5, "duplicate": 1, "reorder": True, "seed": 3})
    assert answer.status_code == 200
    assert answer.json() | {"drop": 0.5, "duplicate": 1.0, "reorder": True, "seed": 3} == (
        answer.json()
    )
    for bad in ({"drop": 1.5}, {"duplicate": -0.1}, {"reorder": "half"}, {"seed": "x"}):
        assert HTTP.post(base, json=bad).status_code == 422, bad
    HTTP.post(base, json={"drop": 0.5, "seed": 3})
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    queue_and_cancel(hooked_github, 20)
    state = HTTP.get(base).json()
    assert state["drop"] == 0.5 and state["seed"] == 3
    assert state["faults"] == hooked_github.delivery_faults
    assert state["faults"]["dropped"] == sum(
        d["error"] == "dropped" for d in hooked_github.deliveries
    )
    parser = Command().create_parser("manage.py", "fake_github")
    args = ["--drop", "0.2", "--duplicate", "0.3", "--reorder", "0.3", "--new-ids"]
    options = vars(parser.parse_args([*args, "--delivery-seed", "9"]))
    fake = cli.build({**options, "port": 0})
    try:
        assert fake.delivery_mode | {"drop": 0.2, "duplicate": 0.3, "reorder": 0.3} == (
            fake.delivery_mode
        )
        assert fake.delivery_mode["new_ids"] is True and fake.delivery_mode["seed"] == 9
    finally:
        fake.stop()
    with pytest.raises(CommandError, match="--drop: 2 is not a share from 0 to 1"):
        parser.parse_args(["--drop", "2"])


def test_fake02_at_a_concurrency_deliveries_are_in_flight_that_many_at_once(
    hooked_github: FakeGitHub, webhook_receiver: WebhookReceiver
) -> None:
    """FAKE-02: one at a time by default (the next waits for an answer), and at
    concurrency N (set_delivery, or POST /_fake/delivery) N in flight while none is answered;
    the rest go once answers come, each recorded once."""
    hooked_github.add_installation("acme", "Organization", ["acme/app"])
    webhook_receiver.answering.clear()
    try:
        hooked_github.queue_job(repo="acme/app", labels=LABELS)
        hooked_github.queue_job(repo="acme/app", labels=LABELS)
        webhook_receiver.wait_for(1)
        # One in flight (unanswered) holds the other in the outbox: the fake's own counters.
        hooked_github.wait_sending(in_flight=1, waiting=1)
        assert len(webhook_receiver.received) == 1 and not hooked_github.deliveries
        webhook_receiver.answering.set()
        webhook_receiver.wait_for(2)
        hooked_github.wait_deliveries(2)
        webhook_receiver.answering.clear()
        base = f"{hooked_github.url}/_fake/delivery"
        assert HTTP.post(base, json={"concurrency": 0}).status_code == 422
        assert HTTP.post(base, json={"concurrency": 3}).json()["concurrency"] == 3
        for _ in range(5):
            hooked_github.queue_job(repo="acme/app", labels=LABELS)
        webhook_receiver.wait_for(5)
        hooked_github.wait_sending(in_flight=3, waiting=2)  # three slots, all taken
        assert len(webhook_receiver.received) == 5 and len(hooked_github.deliveries) == 2
    finally:
        webhook_receiver.answering.set()
    webhook_receiver.wait_for(7)
    assert [d["status_code"] for d in hooked_github.wait_deliveries(7)] == [202] * 7
    with pytest.raises(ValueError, match="concurrency"):
        hooked_github.set_delivery(concurrency=True)


# ---- control over HTTP and the command line --------------------------------------------


def test_fake01_control_routes_drive_the_fake_over_http(fake_github: FakeGitHub) -> None:
    """FAKE-01: /_fake/installations, jobs, job, cancel, info, runners, deliveries, calls."""
    base = f"{fake_github.url}/_fake"
    created = HTTP.post(
        f"{base}/installations",
        json={"account": "acme", "account_type": "Organization", "repositories": ["acme/app"]},
    )
    assert created.status_code == 201
    inst_id = created.json()["id"]
    job = HTTP.post(
        f"{base}/jobs",
        json={"repo": "acme/app", "labels": LABELS, "duration": 0.1, "conclusion": "failure"},
    )
    assert job.status_code == 201 and job.json()["status"] == "queued"
    job_id = job.json()["id"]
    assert HTTP.get(f"{base}/jobs/{job_id}").json()["labels"] == LABELS
    assert HTTP.get(f"{base}/jobs/123").status_code == 404
    assert HTTP.post(f"{base}/jobs/{job_id}/cancel").json()["conclusion"] == "cancelled"
    assert HTTP.post(f"{base}/jobs", json={"repo": "acme/nope", "labels": ["x"]}).status_code == 422
    assert HTTP.post(f"{base}/installations", json={}).status_code == 422
    info = HTTP.get(f"{base}/info").json()
    assert info["app_id"] == fake_github.app_id
    assert info["installations"][0]["repositories"] == ["acme/app"]
    assert HTTP.get(f"{base}/runners", params={"installation_id": inst_id}).json() == []
    assert len(HTTP.get(f"{base}/deliveries").json()) == 2
    assert HTTP.get(f"{base}/calls").json() == []
    assert HTTP.post(f"{base}/expire_tokens").status_code == 200
    assert HTTP.get(f"{base}/nothing").status_code == 404


def test_fake01_the_command_line_serves_until_sigterm(tmp_path: Any) -> None:
    """FAKE-01: `python -m runners.github.fake` (the management command's body) runs it."""
    key_file, id_file = tmp_path / "key.pem", tmp_path / "app-id"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runners.github.fake",
            "--installation",
            "acme",
            "--repo",
            "acme/app",
            "--repo",
            "solo/tool",
            "--private-key-file",
            str(key_file),
            "--app-id-file",
            str(id_file),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+)", first).group(1)
        assert proc.stdout.readline().strip() == f"app id: {id_file.read_text().strip()}"
        # Only what the client's JWT helper reads: that fake runs in the other process.
        identity = SimpleNamespace(
            url=url,
            app_id=int(id_file.read_text()),
            private_key_pem=key_file.read_text(),
            clock=time.time,
        )
        client = GitHubClient(cast(FakeGitHub, identity))
        listed = client.get("/app/installations", headers=client.app()).json()
        assert sorted(i["account"]["login"] for i in listed) == ["acme", "solo"]
        client.close()
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        proc.terminate()
        assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        proc.wait()


def test_fake01_the_management_command_takes_the_same_options() -> None:
    """FAKE-01: `manage.py fake_github` parses --port, --webhook-url, --installation, ..."""

    parser = Command().create_parser("manage.py", "fake_github")
    options = parser.parse_args(
        ["--port", "8123", "--webhook-url", "http://127.0.0.1:9/h", "--webhook-secret", "s"]
        + ["--installation", "acme", "--repo", "acme/app", "--private-key-file", "k"]
    )
    assert options.port == 8123 and options.installation == ["acme"]
    assert options.repo == ["acme/app"] and options.webhook_secret == "s"


# ---- FAKE-03: the walk (keep it last in this file) -------------------------------------


def exercise_every_operation(gh: GitHubClient, clock: MovableClock) -> None:
    """Call every operation the fake serves, on success and error paths, over HTTP."""
    fake = gh.fake
    org, user = org_and_user(fake)
    gh.get("/app", headers=gh.app())
    gh.get("/app/installations", headers=gh.app(), params={"per_page": 1})
    gh.get(f"/app/installations/{org}", headers=gh.app())
    gh.get("/app/installations/1", headers=gh.app())
    gh.get("/orgs/acme/installation", headers=gh.app())
    gh.get("/repos/mona/dotfiles/installation", headers=gh.app())
    gh.get("/repos/mona/none/installation", headers=gh.app())
    acme = gh.inst(org)
    gh.inst(org, repositories=["lib"])
    gh.post(
        f"/app/installations/{org}/access_tokens", headers=gh.app(), json={"repositories": ["x"]}
    )
    gh.post("/app/installations/1/access_tokens", headers=gh.app())
    gh.post(f"/app/installations/{org}/access_tokens", headers={"Authorization": "Bearer x.y.z"})
    gh.get("/installation/repositories", headers=acme)
    gh.get("/installation/repositories", headers={"Authorization": "token nope"})
    gh.get("/rate_limit", headers=acme)
    gh.get("/orgs/acme/actions/runner-groups", headers=acme)
    runner_ids = {}
    for scope in ("/orgs/acme", "/repos/acme/app"):
        answer = jit(gh, acme, scope, "walk")
        runner_ids[scope] = answer.json()["runner"]["id"]
        jit(gh, acme, scope, "walk")
        jit(gh, acme, scope, "bad", labels=[])
        gh.post(
            f"{scope}/actions/runners/generate-jitconfig",
            headers=acme,
            json={"name": "g", "runner_group_id": 9, "labels": ["x"]},
        )
        gh.post(f"{scope}/actions/runners/registration-token", headers=acme)
        gh.post(f"{scope}/actions/runners/remove-token", headers=acme)
        gh.get(f"{scope}/actions/runners", headers=acme, params={"per_page": 1})
        gh.get(f"{scope}/actions/runners/{runner_ids[scope]}", headers=acme)
        gh.get(f"{scope}/actions/runners/999999", headers=acme)
    busy = jit(gh, acme, "/orgs/acme", "busy").json()
    session = go_online(fake, busy["encoded_jit_config"])
    job_id = fake.queue_job(repo="acme/app", labels=LABELS)
    queued = fake.queue_job(repo="acme/app", labels=["nothing-has-this"])
    gh.delete(f"/orgs/acme/actions/runners/{busy['runner']['id']}", headers=acme)
    for scope, runner_id in runner_ids.items():
        gh.delete(f"{scope}/actions/runners/{runner_id}", headers=acme)
    run_id = fake.job(job_id)["run_id"]
    for status in ("", "queued", "in_progress", "completed"):
        gh.get(
            "/repos/acme/app/actions/runs",
            headers=acme,
            params={"status": status} if status else {},
        )
    gh.get(f"/repos/acme/app/actions/runs/{run_id}", headers=acme)
    gh.get(f"/repos/acme/app/actions/runs/{run_id}/jobs", headers=acme)
    gh.get(f"/repos/acme/app/actions/jobs/{job_id}", headers=acme)
    gh.get(f"/repos/acme/app/actions/jobs/{queued}", headers=acme)
    poll(fake, session)
    complete(fake, session, job_id, "success")
    gh.get(f"/repos/acme/app/actions/jobs/{job_id}", headers=acme)
    gh.get(f"/repos/acme/app/actions/runs/{run_id}", headers=acme)
    fake.cancel_job(queued)
    gh.get(f"/repos/acme/app/actions/jobs/{queued}", headers=acme)
    gh.get("/repos/acme/app/actions/runs/1", headers=acme)
    gh.get("/repos/acme/app/actions/jobs/1", headers=acme)
    gh.get(f"/orgs/acme/actions/runners/{runner_ids['/orgs/acme']}/labels", headers=acme)
    gh.get("/orgs/mona/actions/runner-groups", headers=gh.inst(user))
    fake.rate_limit(org, reset_in=60)
    gh.get("/orgs/acme/actions/runners", headers=acme)
    gh.get("/rate_limit", headers=acme)
    fake.rate_limit(org, reset_in=None, retry_after=10)
    gh.get("/repos/acme/app/actions/runs", headers=acme)
    fake.rate_limit(org, reset_in=None)
    gh.get("/installation/repositories", headers=acme)
    gh.get("/rate_limit", headers=acme)
    fake.clear_rate_limit(org)
    clock.advance(fake.token_lifetime + 1)
    gh.get("/installation/repositories", headers=acme)
    gh.get("/app", headers=gh.app())
    # The App's webhook delivery log: the walk's jobs were delivered to nobody (timed out).
    listed = gh.get("/app/hook/deliveries", headers=gh.app(), params={"per_page": 1}).json()
    gh.get("/app/hook/deliveries", headers=gh.app(), params={"status": "sometimes"})
    gh.get(f"/app/hook/deliveries/{listed[0]['id']}", headers=gh.app())
    gh.get("/app/hook/deliveries/1", headers=gh.app())
    gh.get("/app/hook/deliveries", headers=gh.inst(org))
    gh.post(f"/app/hook/deliveries/{listed[0]['id']}/attempts", headers=gh.app())
    gh.post("/app/hook/deliveries/1/attempts", headers=gh.app())


def test_fake03_every_response_validates_against_githubs_schemas(
    gh: GitHubClient,
    fake_github_clock: MovableClock,
    github_schemas: SchemaBook,
    recorded_responses: list[Any],
) -> None:
    """FAKE-03: every GitHub API response this session received validates against
    response-schemas.json (the operation's schema for its status; GitHub's basic-error shape
    for an error status the operation does not list), and the walk reaches every operation
    the fake serves."""
    before = len(RESPONSES)
    exercise_every_operation(gh, fake_github_clock)
    assert len(recorded_responses) > before
    seen: set[str] = set()
    for rec in recorded_responses:
        seen.add(github_schemas.validate_response(rec))
        assert rec.body is None or rec.headers["content-type"].startswith("application/json")
        assert "x-ratelimit-limit" in rec.headers and "x-ratelimit-resource" in rec.headers
    served = {key for key in github_schemas.operations} - {
        "POST /app-manifests/{code}/conversions",
        "GET /orgs/{org}/actions/runners/downloads",
    }
    reached = {entry.rsplit(" ", 1)[0] for entry in seen}
    assert served <= reached, sorted(served - reached)
    for needed in (
        "POST /orgs/{org}/actions/runners/generate-jitconfig 409",
        "POST /orgs/{org}/actions/runners/generate-jitconfig 422",
        "DELETE /orgs/{org}/actions/runners/{runner_id} 422",
        "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id} 204",
        "GET /orgs/{org}/actions/runners 403",
        "GET /repos/{owner}/{repo}/actions/runs 429",
        "GET /installation/repositories 401",
        "GET /app/hook/deliveries 422",
        "POST /app/hook/deliveries/{delivery_id}/attempts 202",
    ):
        assert needed in seen, needed


def test_fake03_the_schema_check_catches_a_wrong_shape(github_schemas: SchemaBook) -> None:
    """FAKE-03: the validator used above does fail on a response GitHub would not send."""

    bad_runner = {"id": 1, "name": "r", "os": "linux", "status": "online", "labels": []}
    with pytest.raises(Exception, match="busy"):
        github_schemas.validate_response(
            Recorded("GET", "/orgs/acme/actions/runners/1", 200, {}, bad_runner)
        )
    with pytest.raises(AssertionError):
        github_schemas.validate_response(Recorded("GET", "/app", 201, {}, {}))


# The members of actions/runner's RunnerSettings (src/Runner.Common/ConfigurationStore.cs),
# written out here rather than imported, so the fake is checked against the runner's source.
RUNNER_SETTINGS_MEMBERS = {
    "IsHostedServer", "AgentId", "AgentName", "SkipSessionRecover", "PoolId", "PoolName",
    "DisableUpdate", "Ephemeral", "ServerUrl", "GitHubUrl", "WorkFolder",
    "MonitorSocketAddress", "UseV2Flow", "UseRunnerAdminFlow", "ServerUrlV2",
}  # fmt: skip


def test_fake01_the_jit_runner_file_carries_the_runners_own_settings_keys(
    gh: GitHubClient,
) -> None:
    """FAKE-01: `.runner` in the JIT config has RunnerSettings' keys, as GitHub issues it."""
    org, _ = org_and_user(gh.fake)
    answer = jit(gh, gh.inst(org), "/repos/acme/app", "zoomies-1", ["self-hosted", "gpu"])
    assert answer.status_code == 201
    runner = answer.json()["runner"]
    settings = decode(answer.json()["encoded_jit_config"])[".runner"]
    assert set(settings) <= RUNNER_SETTINGS_MEMBERS, set(settings) - RUNNER_SETTINGS_MEMBERS
    assert settings["AgentId"] == runner["id"]
    assert settings["AgentName"] == "zoomies-1"
    assert settings["PoolId"] == 1 and settings["PoolName"] == "Default"
    assert settings["ServerUrl"] == gh.fake.url
    assert settings["GitHubUrl"] == f"{gh.fake.url}/acme/app"
    assert settings["WorkFolder"] == "_work"
    assert settings["Ephemeral"] is True


def test_fake01_a_jit_runner_without_self_hosted_is_never_given_a_job_that_asks_for_it(
    gh: GitHubClient,
) -> None:
    """FAKE-01: GitHub adds no default label to a JIT runner, and assigns a job only to a
    runner that has every one of its labels."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    bare = jit(gh, headers, "/orgs/acme", "zoomies-bare", ["gpu"])
    assert [label["name"] for label in bare.json()["runner"]["labels"]] == ["gpu"]
    go_online(gh.fake, bare.json()["encoded_jit_config"])
    job = gh.fake.queue_job("acme/app", ["self-hosted", "linux", "x64", "gpu"])
    assert gh.fake.job(job)["status"] == "queued"  # the bare runner lacks three of them
    full = jit(gh, headers, "/orgs/acme", "zoomies-full", ["self-hosted", "Linux", "X64", "gpu"])
    go_online(gh.fake, full.json()["encoded_jit_config"])
    taken = gh.fake.wait_job(job, "in_progress")
    assert taken["runner_name"] == "zoomies-full"


def test_fake_issue29_a_runner_held_offline_keeps_its_registration_offline_until_let_in(
    gh: GitHubClient,
) -> None:
    """Issue 29 item 1: the fake can hold a runner away from GitHub, as a network that
    cannot reach it would: its session is answered 503, its registration stays offline and
    its JIT config unused, and once let in the same config opens its session."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    encoded = jit(gh, headers, "/orgs/acme", "zoomies-far").json()["encoded_jit_config"]
    files = decode(encoded)
    hello = {"runner_id": files[".runner"]["AgentId"],
             "secret": files[".credentials"]["data"]["secret"], "os": "linux"}  # fmt: skip
    held = HTTP.post(f"{gh.fake.url}/_fake/runners/offline", json={"names": ["zoomies-far"]})
    assert held.json() == {"held": ["zoomies-far"]}
    assert HTTP.post(f"{gh.fake.url}/_runner/sessions", json=hello).status_code == 503
    listed = gh.get("/orgs/acme/actions/runners", headers=headers).json()["runners"]
    assert [(r["name"], r["status"]) for r in listed] == [("zoomies-far", "offline")]
    gh.fake.hold_runners_offline(False)
    assert HTTP.post(f"{gh.fake.url}/_runner/sessions", json=hello).status_code == 201
    listed = gh.get("/orgs/acme/actions/runners", headers=headers).json()["runners"]
    assert [r["status"] for r in listed] == ["online"]


def test_fake_issue29_uninstalling_sends_installation_deleted_and_refuses_its_tokens(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver, github_schemas: SchemaBook
) -> None:
    """Issue 29 item 3: the App uninstalled from an account. GitHub sends a signed
    `installation.deleted` (as its schema has it), refuses the installation's tokens and
    mints none for it; the registrations stay, out of the App's reach."""
    fake = hooked_gh.fake
    inst = fake.add_installation("acme", "Organization", ["acme/app"])
    headers = hooked_gh.inst(inst)
    assert jit(hooked_gh, headers, "/orgs/acme", "zoomies-1").status_code == 201
    answer = HTTP.post(f"{fake.url}/_fake/uninstall", json={"installation_id": inst})
    assert answer.status_code == 200
    (item,) = webhook_receiver.wait_for(1)
    assert item.headers["x-github-event"] == "installation"
    assert item.headers["x-github-delivery"] == answer.json()["delivery"]
    expected = signature(WEBHOOK_SECRET, item.body, hashlib.sha256)
    assert hmac.compare_digest(item.headers["x-hub-signature-256"], f"sha256={expected}")
    payload = item.json()
    schema = github_schemas.webhooks["installation-deleted"]["schema"]
    github_schemas._validator("installation-deleted", schema).validate(payload)
    assert (payload["action"], payload["installation"]["id"]) == ("deleted", inst)
    assert hooked_gh.get("/orgs/acme/actions/runners", headers=headers).status_code == 401
    token = hooked_gh.post(f"/app/installations/{inst}/access_tokens", headers=hooked_gh.app())
    assert token.status_code == 404
    assert [d["event"] for d in fake.wait_deliveries(1)] == ["installation"]


def test_fake_issue29_removed_repositories_and_any_event_are_sent_signed_and_recorded(
    hooked_gh: GitHubClient, webhook_receiver: WebhookReceiver, github_schemas: SchemaBook
) -> None:
    """Issue 29 items 2 and 3: `installation_repositories.removed` as its schema has it (the
    repository is out of the installation's reach after it), and any delivery a test hands
    the fake, such as a job naming an installation the receiver does not know, signed and
    kept in the App's delivery log like every other."""
    fake = hooked_gh.fake
    inst = fake.add_installation("acme", "Organization", ["acme/app", "acme/lib"])
    headers = hooked_gh.inst(inst)
    fake.remove_repositories(inst, ["acme/lib"])
    payload = webhook_receiver.wait_for(1)[0].json()
    schema = github_schemas.webhooks["installation-repositories-removed"]["schema"]
    github_schemas._validator("installation-repositories-removed", schema).validate(payload)
    assert [r["full_name"] for r in payload["repositories_removed"]] == ["acme/lib"]
    assert hooked_gh.get("/repos/acme/lib/actions/runners", headers=headers).status_code == 404
    assert hooked_gh.get("/repos/acme/app/actions/runners", headers=headers).status_code == 200

    foreign = {"action": "queued", "installation": {"id": 9999}, "workflow_job": {"id": 1}}
    answer = HTTP.post(
        f"{fake.url}/_fake/event", json={"event": "workflow_job", "payload": foreign}
    )
    second = webhook_receiver.wait_for(2)[1]
    assert second.json() == foreign and second.headers["x-github-event"] == "workflow_job"
    assert second.headers["x-github-delivery"] == answer.json()["delivery"]
    fake.wait_deliveries(2)  # recorded once the receiver has answered
    logged = [d for d in fake.hook_deliveries if d["guid"] == answer.json()["delivery"]]
    assert [(d["event"], d["installation_id"]) for d in logged] == [("workflow_job", 9999)]


def test_fake01_runs_filtered_by_created_as_githubs_search_syntax(gh: GitHubClient) -> None:
    """FAKE-01: `created` takes GitHub's search syntax (`>=`, `>`, `<=`, `<`, `A..B`, a bare
    date or date-time with its offset) on a run's `created_at`; anything else is a 422, not
    a list that silently ignores the filter."""
    org, _ = org_and_user(gh.fake)
    headers = gh.inst(org)
    moment = [1_796_526_000.0]  # 2026-12-06T03:00:00Z
    gh.fake.clock = lambda: moment[0]
    early = gh.fake.queue_job(repo="acme/app", labels=["nothing-matches"], name="early")
    moment[0] += 3600  # 04:00:00Z
    late = gh.fake.queue_job(repo="acme/app", labels=["nothing-matches"], name="late")
    path = "/repos/acme/app/actions/runs"

    def listed(created: str) -> list[int]:
        answer = gh.get(path, headers=headers, params={"created": created})
        assert answer.status_code == 200, answer.text
        return sorted(r["id"] for r in answer.json()["workflow_runs"])

    first, second = gh.fake.job(early)["run_id"], gh.fake.job(late)["run_id"]
    both = sorted([first, second])
    assert listed(">=2026-12-06T03:30:00+00:00") == [second]
    assert listed(">=2026-12-06T04:00:00Z") == [second]
    assert listed(">2026-12-06T04:00:00+00:00") == []
    assert listed("<2026-12-06T04:00:00+00:00") == [first]
    assert listed("<=2026-12-06T04:00:00+00:00") == both
    assert listed("2026-12-06") == both
    assert listed(">2026-12-06") == []
    assert listed("2026-12-06T02:00:00+00:00..2026-12-06T03:00:00+00:00") == [first]
    assert listed("2026-12-06T03:00:01+00:00..*") == [second]
    for bad in ("yesterday", ">=2026-12-06T03:00:00", ">=2026-12-06T03:00:00 00:00", ""):
        answer = gh.get(path, headers=headers, params={"created": bad})
        assert answer.status_code == 422, (bad, answer.status_code)
