"""The production GitHub App client, over real sockets against the fake GitHub (ARCH-10).

Every response the client receives is recorded by its own transport and validated against
GitHub's schemas when each test ends (FAKE-03, seen from the client's side). Time moves on
the clock the fake and the client share; nothing sleeps for it.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from runners.github.client import GitHubApp, InstallationClient, JitConfig
from runners.github.errors import Conflict, GitHubError, NotFound, RateLimited, TransportError
from runners.github.fake import FakeGitHub
from runners.github.fake.runner import FakeRunner, decode_jit_config
from tests.ghes_proxy import PrefixProxy
from tests.runners.github.conftest import RecordingTransport

LABELS = ["self-hosted", "linux", "x64", "zoomies-linux-x64"]


# The recording transport and the `recorder` and `app` fixtures are in conftest.py: the
# hook-delivery tests use them too.


@pytest.fixture
def acme(fake_github) -> int:
    return fake_github.add_installation(
        account="acme", account_type="Organization", repositories=["acme/app", "acme/lib"]
    )


@pytest.fixture
def gh(app, acme) -> InstallationClient:
    return app.for_installation(acme)


def _token_mints(fake: FakeGitHub, installation_id: int) -> int:
    path = f"/app/installations/{installation_id}/access_tokens"
    return sum(1 for method, p, _ in fake.calls if method == "POST" and p == path)


# -- credentials (ARCH-10) ------------------------------------------------------------------


def test_arch10_every_request_carries_githubs_headers_and_a_bearer_credential(gh, recorder):
    gh.list_runners(org="acme")
    assert [s.path for s in recorder.seen] == [
        f"/app/installations/{gh.installation_id}/access_tokens",
        "/orgs/acme/actions/runners",
    ]
    for seen in recorder.seen:
        assert seen.request_headers["accept"] == "application/vnd.github+json"
        assert seen.request_headers["x-github-api-version"] == "2022-11-28"
        assert seen.request_headers["user-agent"] == "zoomies"
        assert seen.request_headers["authorization"].startswith("Bearer ")


def test_arch10_the_app_jwt_verifies_with_the_apps_public_key(app, fake_github, fake_github_clock):
    public = serialization.load_pem_private_key(
        fake_github.private_key_pem.encode(), password=None
    ).public_key()
    now = fake_github_clock()
    claims = jwt.decode(
        app.jwt(), public, algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False}
    )
    assert claims["iss"] == str(fake_github.app_id)
    assert abs(claims["iat"] - (now - 60)) <= 1
    assert 0 < claims["exp"] - now <= 600
    assert app.jwt() == app.jwt()  # Cached, not re-signed per call.


def test_arch10_the_app_lists_its_installations(app, fake_github, acme):
    other = fake_github.add_installation(account="octo", account_type="User", repositories=[])
    assert {i["id"] for i in app.installations()} == {acme, other}
    assert app.installation(acme)["account"]["login"] == "acme"
    with pytest.raises(NotFound) as excinfo:
        app.installation(999)
    assert excinfo.value.status == 404


def test_arch10_an_installation_token_is_cached_then_renewed_five_minutes_before_expiry(
    app, fake_github, fake_github_clock, acme
):
    first = app.installation_token(acme)
    assert app.installation_token(acme) == first
    # expires_at comes back in whole seconds, so stay a little clear of the boundary.
    fake_github_clock.advance(3600 - 300 - 2)
    assert app.installation_token(acme) == first
    fake_github_clock.advance(3)
    second = app.installation_token(acme)
    assert second != first
    assert _token_mints(fake_github, acme) == 2
    # The renewed token works: the JWT that minted it was re-signed on the moved clock.
    assert app.for_installation(acme).repositories() == ["acme/app", "acme/lib"]


def test_arch10_eight_concurrent_callers_get_one_token_per_installation(app, fake_github, acme):
    beta = fake_github.add_installation(account="beta", repositories=["beta/app"])
    barrier = threading.Barrier(8)
    tokens: dict[int, list[str]] = {acme: [], beta: []}

    def worker(installation_id: int) -> None:
        barrier.wait()
        tokens[installation_id].append(app.installation_token(installation_id))

    threads = [threading.Thread(target=worker, args=((acme, beta)[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for installation_id in (acme, beta):
        assert len(tokens[installation_id]) == 4
        assert len(set(tokens[installation_id])) == 1
        assert _token_mints(fake_github, installation_id) == 1
    assert app.token_mints == 2


def test_arch10_a_token_refused_with_401_is_replaced_once_and_the_call_retried(
    gh, app, fake_github, recorder
):
    gh.list_runners(org="acme")
    fake_github.expire_tokens()
    assert gh.list_runners(org="acme") == []
    # The retry is conditional like the first call, and the list has not changed: 304.
    assert recorder.statuses("GET", "/orgs/acme/actions/runners") == [200, 401, 304]
    assert _token_mints(fake_github, gh.installation_id) == 2


# -- runners --------------------------------------------------------------------------------


def test_arch10_a_jit_config_for_an_org_pool_registers_one_runner(gh, fake_github):
    config = gh.generate_jitconfig(org="acme", name="zoomies-linux-x64-1-abc", labels=LABELS)
    assert isinstance(config, JitConfig)
    assert config.name == "zoomies-linux-x64-1-abc"
    [runner] = fake_github.runners(gh.installation_id)
    assert runner["id"] == config.runner_id
    assert "zoomies-linux-x64" in {label["name"] for label in runner["labels"]}
    assert decode_jit_config(config.encoded_jit_config).runner_id == config.runner_id
    # SEC-05: the configuration is a credential; it never shows in a repr or a log line.
    assert config.encoded_jit_config not in repr(config)


def test_arch10_a_jit_config_for_a_repo_pool_is_scoped_to_the_repository(gh):
    config = gh.generate_jitconfig(repo="acme/app", name="zoomies-repo-1", labels=LABELS)
    assert [r["id"] for r in gh.list_runners(repo="acme/app")] == [config.runner_id]
    assert gh.list_runners(org="acme") == []
    assert gh.list_runners(repo="acme/lib") == []


def test_a_jit_name_over_64_characters_is_refused_before_any_call(gh, fake_github):
    with pytest.raises(ValueError, match="64"):
        gh.generate_jitconfig(org="acme", name="z" * 65, labels=LABELS)
    with pytest.raises(ValueError, match="exactly one"):
        gh.generate_jitconfig(org="acme", repo="acme/app", name="z", labels=LABELS)
    with pytest.raises(ValueError, match="owner/name"):
        gh.generate_jitconfig(repo="app", name="z", labels=LABELS)
    with pytest.raises(ValueError, match="labels"):
        gh.generate_jitconfig(org="acme", name="z", labels=[])
    assert fake_github.calls == []
    gh.generate_jitconfig(org="acme", name="z" * 64, labels=LABELS)


def test_a_taken_runner_name_is_a_conflict(gh):
    gh.generate_jitconfig(org="acme", name="zoomies-twice", labels=LABELS)
    with pytest.raises(Conflict) as excinfo:
        gh.generate_jitconfig(org="acme", name="zoomies-twice", labels=LABELS)
    assert excinfo.value.status == 409


def test_a_registration_token_comes_with_its_expiry(gh, fake_github_clock):
    for scope in ({"org": "acme"}, {"repo": "acme/app"}):
        token, expires_at = gh.registration_token(**scope)
        assert token
        assert isinstance(expires_at, datetime) and expires_at.tzinfo is not None
        assert 3500 < expires_at.timestamp() - fake_github_clock() <= 3600


def test_list_runners_follows_every_page_at_100_a_page(gh, recorder):
    made = {
        gh.generate_jitconfig(org="acme", name=f"zoomies-many-{i}", labels=LABELS).runner_id
        for i in range(130)
    }
    assert {r["id"] for r in gh.list_runners(org="acme")} == made
    pages = [s for s in recorder.seen if s.path == "/orgs/acme/actions/runners"]
    assert len(pages) == 2
    assert pages[0].query["per_page"] == ["100"]
    assert pages[1].query["page"] == ["2"]


@pytest.fixture
def running_runner(gh) -> Iterator[Callable[[str], tuple[JitConfig, FakeRunner]]]:
    """Start fake runners from JIT configs, in threads; stopped at the end of the test."""
    started: list[tuple[FakeRunner, threading.Thread]] = []

    def start(name: str) -> tuple[JitConfig, FakeRunner]:
        config = gh.generate_jitconfig(org="acme", name=name, labels=LABELS)
        runner = FakeRunner(
            decode_jit_config(config.encoded_jit_config), out=io.StringIO(), poll_wait=1
        )
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        started.append((runner, thread))
        return config, runner

    yield start
    for runner, thread in started:
        runner.stop()
        thread.join(5)


def test_delete_runner_answers_deleted_busy_or_gone(gh, fake_github, running_runner):
    """A busy runner's 422 is an answer, not a crash."""
    idle = gh.generate_jitconfig(org="acme", name="zoomies-idle", labels=LABELS)
    assert gh.delete_runner(org="acme", runner_id=idle.runner_id) == "deleted"
    assert gh.delete_runner(org="acme", runner_id=idle.runner_id) == "gone"
    assert gh.delete_runner(repo="acme/app", runner_id=424242) == "gone"

    busy, _ = running_runner("zoomies-busy")
    job_id = fake_github.queue_job(repo="acme/app", labels=LABELS, duration=30)
    fake_github.wait_job(job_id, "in_progress")
    assert gh.delete_runner(org="acme", runner_id=busy.runner_id) == "busy"
    assert busy.runner_id in {r["id"] for r in gh.list_runners(org="acme")}


# -- repositories and jobs (the poller's view) -----------------------------------------------


def test_repositories_lists_full_names_across_pages(app, fake_github):
    names = [f"big/repo-{i:03}" for i in range(105)]
    big = fake_github.add_installation(account="big", repositories=names)
    assert app.for_installation(big).repositories() == names


def test_poll06_active_jobs_are_the_jobs_of_queued_and_running_runs(
    gh, fake_github, running_runner
):
    running_runner("zoomies-taker")
    running = fake_github.queue_job(repo="acme/app", labels=LABELS, duration=30)
    fake_github.wait_job(running, "in_progress")
    queued = fake_github.queue_job(repo="acme/app", labels=["self-hosted", "gpu"])
    done = fake_github.queue_job(repo="acme/app", labels=["self-hosted", "gpu"])
    fake_github.cancel_job(done)

    runs = gh.list_runs("acme/app", "queued")
    assert [run["id"] for run in runs] == [fake_github.job(queued)["run_id"]]
    jobs = gh.list_run_jobs("acme/app", runs[0]["id"])
    assert [job["id"] for job in jobs] == [queued]

    active = {job["id"]: job["status"] for job in gh.active_jobs("acme/app")}
    assert active == {running: "in_progress", queued: "queued"}
    assert gh.active_jobs("acme/lib") == []


# -- rate limits (POLL-05, POLL-06, POLL-07) ---------------------------------------------------


def test_poll06_a_primary_limit_carries_the_reset_instant_as_a_number(
    gh, fake_github, fake_github_clock
):
    gh.list_runners(org="acme")
    fake_github.rate_limit(gh.installation_id, reset_in=120.0)
    with pytest.raises(RateLimited) as excinfo:
        gh.list_runners(org="acme")
    error = excinfo.value
    assert error.status == 403
    assert error.installation_id == gh.installation_id
    assert isinstance(error.retry_at, float)
    assert 119 <= error.retry_at - fake_github_clock() <= 121
    stats = gh.stats
    assert stats.rate_limit_remaining == 0
    assert stats.rate_limit_reset == error.retry_at
    assert stats.rate_limited == 1


def test_poll06_a_secondary_limit_carries_now_plus_retry_after(gh, fake_github, fake_github_clock):
    gh.list_runners(org="acme")
    fake_github.rate_limit(gh.installation_id, reset_in=None, retry_after=45)
    before = fake_github_clock()
    with pytest.raises(RateLimited) as excinfo:
        gh.active_jobs("acme/app")
    assert excinfo.value.status == 429
    assert isinstance(excinfo.value.retry_at, float)
    assert before + 45 <= excinfo.value.retry_at <= fake_github_clock() + 45


def test_poll07_a_limit_that_gives_no_time_carries_none(gh, fake_github):
    """The fallback wait itself belongs to the poller; the error only says "no time"."""
    gh.list_runners(org="acme")
    fake_github.rate_limit(gh.installation_id, reset_in=None, retry_after=None)
    with pytest.raises(RateLimited) as excinfo:
        gh.generate_jitconfig(org="acme", name="zoomies-limited", labels=LABELS)
    assert excinfo.value.status == 403
    assert excinfo.value.retry_at is None
    assert "no time" in str(excinfo.value)
    fake_github.clear_rate_limit(gh.installation_id)
    assert gh.list_runners(org="acme") == []


def test_poll05_one_installations_limit_leaves_the_others_working(app, gh, fake_github):
    beta = app.for_installation(
        fake_github.add_installation(account="beta", repositories=["beta/app"])
    )
    fake_github.rate_limit(gh.installation_id, reset_in=60.0)
    with pytest.raises(RateLimited):
        gh.list_runners(org="acme")
    assert beta.list_runners(org="beta") == []
    assert beta.stats.rate_limit_remaining > 0
    assert app.stats(gh.installation_id).rate_limit_remaining == 0


def test_calls_are_counted_per_installation_with_the_quota_github_reported(app, gh, fake_github):
    gh.list_runners(org="acme")
    gh.repositories()
    stats = gh.stats
    assert stats.calls == 2
    assert stats.rate_limit_limit == 5000
    assert stats.rate_limit_remaining == 4998
    assert stats.rate_limit_resource == "core"
    assert app.stats(None).calls == 1  # The token mint, made with the App's JWT.
    assert set(app.all_stats()) == {None, gh.installation_id}


def test_fake03_every_operation_the_client_uses_answers_in_githubs_shape(
    app, gh, fake_github, recorder, github_schemas, running_runner
):
    """Walk every client call once and check each response it saw against its schema."""
    app.installations()
    app.installation(gh.installation_id)
    config = gh.generate_jitconfig(repo="acme/app", name="zoomies-walk-1", labels=LABELS)
    gh.generate_jitconfig(org="acme", name="zoomies-walk-2", labels=LABELS)
    gh.registration_token(org="acme")
    gh.registration_token(repo="acme/app")
    gh.list_runners(org="acme")
    gh.list_runners(repo="acme/app")
    gh.repositories()
    fake_github.queue_job(repo="acme/app", labels=["self-hosted", "gpu"])
    gh.active_jobs("acme/app")
    gh.delete_runner(repo="acme/app", runner_id=config.runner_id)
    gh.delete_runner(repo="acme/app", runner_id=config.runner_id)
    busy, _ = running_runner("zoomies-walk-3")
    fake_github.wait_job(
        fake_github.queue_job(repo="acme/app", labels=LABELS, duration=30), "in_progress"
    )
    gh.delete_runner(org="acme", runner_id=busy.runner_id)
    fake_github.rate_limit(gh.installation_id, reset_in=60.0)
    with pytest.raises(RateLimited):
        gh.list_runners(org="acme")
    matched = {github_schemas.validate_response(seen) for seen in recorder.seen}
    assert matched >= {
        "GET /app/installations 200",
        "GET /app/installations/{installation_id} 200",
        "POST /app/installations/{installation_id}/access_tokens 201",
        "POST /orgs/{org}/actions/runners/generate-jitconfig 201",
        "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig 201",
        "POST /orgs/{org}/actions/runners/registration-token 201",
        "POST /repos/{owner}/{repo}/actions/runners/registration-token 201",
        "GET /orgs/{org}/actions/runners 200",
        "GET /repos/{owner}/{repo}/actions/runners 200",
        "GET /installation/repositories 200",
        "GET /repos/{owner}/{repo}/actions/runs 200",
        "GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs 200",
        "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id} 204",
        "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id} 404",
        "DELETE /orgs/{org}/actions/runners/{runner_id} 422",
        "GET /orgs/{org}/actions/runners 403",
    }


# -- GHES, and servers that misbehave --------------------------------------------------------


def test_arch10_a_ghes_base_url_with_a_path_prefix_works_unchanged(
    fake_github, fake_github_clock, github_schemas
):
    proxy = PrefixProxy(fake_github)
    recorder = RecordingTransport(strip="/api/v3")
    names = [f"acme/repo-{i:03}" for i in range(101)]
    acme = fake_github.add_installation(account="acme", repositories=names)
    try:
        with GitHubApp(
            fake_github.app_id,
            fake_github.private_key_pem,
            base_url=proxy.url + "/",
            clock=fake_github_clock,
            transport=recorder,
        ) as app:
            gh = app.for_installation(acme)
            assert [i["id"] for i in app.installations()] == [acme]
            assert gh.repositories() == names  # Two pages: the next link keeps the prefix.
            config = gh.generate_jitconfig(org="acme", name="zoomies-ghes-1", labels=LABELS)
            assert gh.delete_runner(org="acme", runner_id=config.runner_id) == "deleted"
    finally:
        proxy.stop()
    assert proxy.paths and all(p.startswith("/api/v3/") for p in proxy.paths)
    assert "/api/v3/installation/repositories?per_page=100&page=2" in proxy.paths
    for seen in recorder.seen:
        github_schemas.validate_response(seen)


class Scripted:
    """A tiny real HTTP server answering with `respond(method, path) -> (status, headers, body)`."""

    def __init__(self, respond: Callable[[str, str], tuple[int, dict[str, str], Any]]) -> None:
        self.requests: list[tuple[str, str, str]] = []  # (method, path, authorization)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append(
                    (self.command, self.path, self.headers.get("Authorization", ""))
                )
                status, headers, body = respond(self.command, self.path)
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass  # The client gave up first (the timeout test); nothing to tell.

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def scripted(fake_github) -> Iterator[Callable[..., tuple[Scripted, GitHubApp]]]:
    """A Scripted server and a GitHubApp pointed at it (the fake lends its App key)."""
    made: list[tuple[Scripted, GitHubApp]] = []

    def make(respond, **kwargs: Any) -> tuple[Scripted, GitHubApp]:
        server = Scripted(respond)
        app = GitHubApp(7, fake_github.private_key_pem, base_url=server.url, **kwargs)
        made.append((server, app))
        return server, app

    yield make
    for server, app in made:
        app.close()
        server.stop()


def _mints_tokens(then: Callable[[str, str], tuple[int, dict[str, str], Any]]):
    counter = iter(range(1, 100))

    def respond(method: str, path: str) -> tuple[int, dict[str, str], Any]:
        if path.endswith("/access_tokens"):
            return (
                201,
                {},
                {"token": f"ghs_tok{next(counter)}", "expires_at": "2999-01-01T00:00:00Z"},
            )
        return then(method, path)

    return respond


def test_arch10_a_second_401_is_an_error_that_names_no_credential(scripted):
    server, app = scripted(_mints_tokens(lambda m, p: (401, {}, {"message": "Bad credentials"})))
    with pytest.raises(GitHubError) as excinfo:
        app.for_installation(1).list_runners(org="acme")
    assert excinfo.value.status == 401
    assert not isinstance(excinfo.value, RateLimited)
    assert [r[1] for r in server.requests] == [
        "/app/installations/1/access_tokens",
        "/orgs/acme/actions/runners?per_page=100",
        "/app/installations/1/access_tokens",
        "/orgs/acme/actions/runners?per_page=100",
    ]
    message = str(excinfo.value)
    for _, _, authorization in server.requests:
        assert authorization.split(" ", 1)[1] not in message
    assert "ghs_" not in message and "Bad credentials" in message


def test_a_plain_403_is_not_a_rate_limit(scripted):
    _, app = scripted(
        _mints_tokens(lambda m, p: (403, {}, {"message": "Resource not accessible by integration"}))
    )
    with pytest.raises(GitHubError) as excinfo:
        app.for_installation(1).generate_jitconfig(org="acme", name="z", labels=LABELS)
    assert type(excinfo.value) is GitHubError
    assert excinfo.value.status == 403
    assert "not accessible" in str(excinfo.value)


def test_poll06_a_403_with_retry_after_is_a_limit_until_now_plus_that(scripted):
    clock = lambda: 1_750_000_000.0  # noqa: E731
    _, app = scripted(
        _mints_tokens(lambda m, p: (403, {"Retry-After": "30"}, {"message": "slow down"})),
        clock=clock,
    )
    with pytest.raises(RateLimited) as excinfo:
        app.for_installation(1).repositories()
    assert excinfo.value.retry_at == 1_750_000_030.0
    assert excinfo.value.status == 403


def test_a_next_link_to_another_origin_gets_no_credential(scripted):
    def respond(method: str, path: str) -> tuple[int, dict[str, str], Any]:
        link = '<https://elsewhere.example/installation/repositories?page=2>; rel="next"'
        return 200, {"Link": link}, {"total_count": 2, "repositories": []}

    server, app = scripted(_mints_tokens(respond))
    with pytest.raises(GitHubError, match="another origin"):
        app.for_installation(1).repositories()
    assert len(server.requests) == 2  # The mint and page one; nothing went elsewhere.


def test_a_server_that_does_not_answer_in_time_is_a_transport_error(scripted):
    def respond(method: str, path: str) -> tuple[int, dict[str, str], Any]:
        time.sleep(1.0)
        return 200, {}, []

    _, app = scripted(respond, timeout=0.2)
    with pytest.raises(TransportError, match="did not answer within 0.2 s"):
        app.installations()


def test_a_closed_port_is_a_transport_error_with_a_clear_message(fake_github):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with GitHubApp(7, fake_github.private_key_pem, base_url=f"http://127.0.0.1:{port}") as app:
        with pytest.raises(TransportError) as excinfo:
            app.for_installation(1).list_runners(org="acme")
        message = str(excinfo.value)
        assert f"could not reach GitHub at http://127.0.0.1:{port}" in message
        assert "ConnectError" in message
        assert app.jwt() not in message
        assert excinfo.value.__cause__ is None and excinfo.value.__context__ is None
        assert app.stats(None).transport_errors == 1
