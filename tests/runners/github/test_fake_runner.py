"""The fake runner against the fake GitHub: FAKE-01 and FAKE-04 end to end.

The end-to-end tests start `python -m runners.github.fake.runner` as a child process, the
way an agent does; the rest run the same FakeRunner class on a thread to stay quick.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import httpx
import pytest

from runners.github.fake import FakeGitHub
from runners.github.fake.runner import (
    ENV_JITCONFIG,
    ConfigError,
    FakeRunner,
    decode_jit_config,
    read_jit_config,
)
from tests.runners.github.conftest import (
    REPO_ROOT,
    WEBHOOK_SECRET,
    GitHubClient,
    SchemaBook,
    WebhookReceiver,
)
from tests.waiting import wait_until

LABELS = ["self-hosted", "linux", "x64"]


def mint(gh: GitHubClient, name: str, scope: str = "/orgs/acme") -> dict[str, Any]:
    """A JIT config for a new runner, minted over HTTP the way the controller does."""
    inst = next(i["id"] for i in gh.fake.info()["installations"] if i["account"] == "acme")
    answer = gh.post(
        f"{scope}/actions/runners/generate-jitconfig",
        headers=gh.inst(inst),
        json={"name": name, "runner_group_id": 1, "labels": LABELS},
    )
    assert answer.status_code == 201, answer.text
    return answer.json()


def spawn(encoded: str | None, *args: str) -> subprocess.Popen[str]:
    """The runner as a child process, its config in the environment like the real one."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop(ENV_JITCONFIG, None)
    if encoded is not None:
        env[ENV_JITCONFIG] = encoded
    return subprocess.Popen(
        [sys.executable, "-m", "runners.github.fake.runner", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


class ThreadRunner:
    """A FakeRunner on a thread, with its exit code and log."""

    def __init__(self, encoded: str, poll_wait: float = 20.0) -> None:
        self.out = io.StringIO()
        self.runner = FakeRunner(decode_jit_config(encoded), out=self.out, poll_wait=poll_wait)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.runner.run()

    def join(self, timeout: float = 30.0) -> int | None:
        self.thread.join(timeout)
        return self.code


@pytest.fixture
def acme(hooked_github: FakeGitHub) -> int:
    return hooked_github.add_installation("acme", "Organization", ["acme/app"])


def test_fake04_read_jit_config_takes_the_flag_or_the_environment_and_clears_it() -> None:
    """FAKE-04: ACTIONS_RUNNER_INPUT_JITCONFIG is read then removed, like actions/runner."""
    environ = {ENV_JITCONFIG: "from-env", "OTHER": "x"}
    assert read_jit_config([], environ) == "from-env"
    assert environ == {"OTHER": "x"}
    environ = {ENV_JITCONFIG: "from-env"}
    assert read_jit_config(["--jitconfig", "from-flag"], environ) == "from-flag"
    assert ENV_JITCONFIG not in environ
    assert read_jit_config([], {}) is None


@pytest.mark.parametrize("garbage", ["", "not base64!", "aGVsbG8=", "WyJsaXN0Il0=", "e30="])
def test_fake04_a_garbage_config_does_not_decode(garbage: str) -> None:
    """FAKE-04: anything but base64 JSON of files with .runner and .credentials is refused."""
    with pytest.raises(ConfigError):
        decode_jit_config(garbage)


def test_fake01_fake04_a_runner_process_takes_a_queued_job_runs_it_and_exits_0(
    hooked_gh: GitHubClient,
    acme: int,
    webhook_receiver: WebhookReceiver,
    github_schemas: SchemaBook,
) -> None:
    """FAKE-01, FAKE-04: JIT config -> runner process online -> job handed, run, completed
    with its conclusion -> the process exits 0 and GitHub drops the ephemeral runner;
    the three signed deliveries reach the receiver."""
    fake = hooked_gh.fake
    minted = mint(hooked_gh, "zoomies-e2e-1")
    runner_id = minted["runner"]["id"]
    proc = spawn(minted["encoded_jit_config"])
    try:
        wait_until(lambda: fake.runners(acme)[0]["status"] == "online", 30, "the runner online")
        runner = fake.runners(acme)[0]
        assert runner["busy"] is False and runner["os"] == "linux" and runner["version"]
        job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=0.3, conclusion="success")
        busy = fake.wait_job(job_id, "in_progress", timeout=5)
        assert busy["runner_id"] == runner_id and busy["runner_name"] == "zoomies-e2e-1"
        assert fake.runners(acme)[0]["busy"] is True
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        out = proc.communicate()[0]
    job = fake.job(job_id)
    assert (job["status"], job["conclusion"]) == ("completed", "success")
    assert job["completed_at"] and job["runner_id"] == runner_id
    assert fake.runners(acme) == []
    gone = hooked_gh.get(f"/orgs/acme/actions/runners/{runner_id}", headers=hooked_gh.inst(acme))
    assert gone.status_code == 404
    received = webhook_receiver.wait_for(3)
    assert [r.json()["action"] for r in received] == ["queued", "in_progress", "completed"]
    for item in received:
        digest = hmac.new(WEBHOOK_SECRET.encode(), item.body, hashlib.sha256).hexdigest()
        assert item.headers["x-hub-signature-256"] == f"sha256={digest}"
        github_schemas.validate_webhook(item.json())
    assert received[1].json()["workflow_job"]["runner_name"] == "zoomies-e2e-1"
    assert received[2].json()["workflow_job"]["conclusion"] == "success"
    for step in ("session open", f"got job {job_id}", f"job {job_id} finished: success"):
        assert step in out, out


def test_fake04_a_garbage_config_makes_the_process_exit_1(hooked_github: FakeGitHub) -> None:
    """FAKE-04: like the real listener's TerminatedError; --jitconfig works as well."""
    assert spawn("bm90IGEgY29uZmln").wait(timeout=10) == 1
    assert spawn(None, "--jitconfig", "%%%").wait(timeout=10) == 1
    assert spawn(None).wait(timeout=10) == 1


def test_fake04_a_used_config_is_refused_and_the_second_process_exits_1(
    hooked_gh: GitHubClient, acme: int
) -> None:
    """FAKE-04: a JIT config is single-use, during its runner's life and after it."""
    encoded = mint(hooked_gh, "once")["encoded_jit_config"]
    first = ThreadRunner(encoded)
    wait_until(lambda: hooked_gh.fake.runners(acme)[0]["status"] == "online", 5)
    second = spawn(encoded)
    assert second.wait(timeout=10) == 1
    assert "409" in second.communicate()[0]
    hooked_gh.fake.queue_job(repo="acme/app", labels=LABELS)
    assert first.join() == 0
    third = ThreadRunner(encoded)
    assert third.join() == 1
    assert "404" in third.out.getvalue()


def test_fake04_the_job_conclusion_is_the_one_queued(hooked_gh: GitHubClient, acme: int) -> None:
    """FAKE-04: a job queued to fail ends as failure (and a completed delivery says so)."""
    runner = ThreadRunner(mint(hooked_gh, "failing")["encoded_jit_config"])
    job_id = hooked_gh.fake.queue_job(repo="acme/app", labels=LABELS, conclusion="failure")
    assert runner.join() == 0
    assert hooked_gh.fake.job(job_id)["conclusion"] == "failure"
    deliveries = hooked_gh.fake.wait_deliveries(3)
    assert deliveries[-1]["action"] == "completed"


def test_fake04_sigterm_while_idle_closes_the_session_and_exits_0(
    hooked_gh: GitHubClient, acme: int
) -> None:
    """FAKE-04: a stopped idle runner goes offline; its registration stays until deleted."""
    proc = spawn(mint(hooked_gh, "stoppable")["encoded_jit_config"])
    try:
        wait_until(lambda: hooked_gh.fake.runners(acme)[0]["status"] == "online", 5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        proc.communicate()
    runner = hooked_gh.fake.runners(acme)[0]
    assert (runner["status"], runner["busy"]) == ("offline", False)


def test_fake04_stopping_mid_job_reports_it_cancelled(hooked_gh: GitHubClient, acme: int) -> None:
    """FAKE-04: a runner stopped during its job reports the job cancelled and exits 0."""
    runner = ThreadRunner(mint(hooked_gh, "interrupted")["encoded_jit_config"])
    job_id = hooked_gh.fake.queue_job(repo="acme/app", labels=LABELS, duration=30)
    hooked_gh.fake.wait_job(job_id, "in_progress")
    wait_until(lambda: "got job" in runner.out.getvalue(), 5)
    runner.runner.stop()
    assert runner.join() == 0
    assert hooked_gh.fake.job(job_id)["conclusion"] == "cancelled"


def test_fake04_a_runner_deleted_while_idle_exits_1(hooked_gh: GitHubClient, acme: int) -> None:
    """FAKE-04: deleting an idle runner at GitHub ends its listener (registration gone)."""
    minted = mint(hooked_gh, "scaled-down")
    runner = ThreadRunner(minted["encoded_jit_config"])
    wait_until(lambda: hooked_gh.fake.runners(acme)[0]["status"] == "online", 5)
    path = f"/orgs/acme/actions/runners/{minted['runner']['id']}"
    assert hooked_gh.delete(path, headers=hooked_gh.inst(acme)).status_code == 204
    assert runner.join() == 1
    assert "removed" in runner.out.getvalue()


def test_fake04_a_job_made_for_one_runner_may_be_taken_by_another(
    hooked_gh: GitHubClient, acme: int
) -> None:
    """FAKE-04: GitHub does not bind a job to the runner made for it; any match takes it."""
    early = ThreadRunner(mint(hooked_gh, "early")["encoded_jit_config"])
    wait_until(lambda: hooked_gh.fake.runners(acme)[0]["status"] == "online", 5)
    mint(hooked_gh, "made-for-the-job")  # registered but never started
    job_id = hooked_gh.fake.queue_job(repo="acme/app", labels=LABELS)
    assert early.join() == 0
    assert hooked_gh.fake.job(job_id)["runner_name"] == "early"


def test_fake04_an_unreachable_server_exits_2() -> None:
    """FAKE-04: no server at the config's URL: RetryableError (2), after a short retry."""
    config = decode_jit_config(_config_for("http://127.0.0.1:9"))
    out = io.StringIO()
    runner = FakeRunner(config, out=out)
    runner.stop()  # stopped: no retrying, so the test is quick
    assert runner.run() == 2
    assert "cannot reach" in out.getvalue()


def _config_for(url: str) -> str:

    files = {
        ".runner": {"AgentName": "x", "AgentId": 1, "ServerUrl": url, "Ephemeral": True},
        ".credentials": {"scheme": "OAuth", "data": {"secret": "s"}},
    }
    encoded = {
        name: base64.b64encode(json.dumps(body).encode()).decode() for name, body in files.items()
    }
    return base64.b64encode(json.dumps(encoded).encode()).decode()


def test_fake04_the_runner_module_imports_no_server_dependencies() -> None:
    """FAKE-04: the runner is standard library only, so it starts fast and fits an image."""
    code = (
        "import sys, runners.github.fake.runner as r; "
        "bad = [m for m in ('jwt', 'cryptography', 'django', 'httpx') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"


def test_fake04_runner_protocol_refuses_unknown_sessions(fake_github: FakeGitHub) -> None:
    """FAKE-04: the private runner routes answer 404 without a live session."""
    http = httpx.Client(base_url=fake_github.url)
    assert http.get("/_runner/jobs", headers={"Authorization": "Bearer nope"}).status_code == 404
    assert http.post("/_runner/sessions", json={"runner_id": 12345}).status_code == 404
    assert http.post("/_runner/sessions", content=b"nope").status_code == 400
    assert http.get("/_runner/elsewhere").status_code == 404
    http.close()


@pytest.mark.parametrize(
    "settings",
    [
        # As GitHub's JIT configuration spells RunnerSettings' members...
        {"AgentId": 7, "AgentName": "zoomies-x-7", "ServerUrl": "http://gh/", "Ephemeral": True},
        # ...and as config.sh writes them (camel-cased); the runner reads either.
        {"agentId": 7, "agentName": "zoomies-x-7", "serverUrl": "http://gh/", "ephemeral": True},
    ],
)
def test_fake04_the_runner_reads_the_runner_settings_shape(settings: dict[str, Any]) -> None:
    """FAKE-04: the fake runner reads `.runner` by RunnerSettings' keys, in any case."""

    files = {".runner": settings, ".credentials": {"scheme": "OAuth", "data": {"secret": "s"}}}
    encoded = base64.b64encode(
        json.dumps(
            {n: base64.b64encode(json.dumps(b).encode()).decode() for n, b in files.items()}
        ).encode()
    ).decode()
    config = decode_jit_config(encoded)
    assert (config.runner_id, config.name, config.server_url) == (7, "zoomies-x-7", "http://gh")
    assert config.ephemeral is True
