"""Scale-out on the engines an operator already runs (issue 26 items 4 and 5): PostgreSQL and
Redis, two `manage.py web` processes sharing one port, two `manage.py workers`, and a remote
agent, with no controller process at all. A job runs end to end; the worker holding the
ticker is killed with SIGKILL mid-burst and the other takes over within its lease, with no
duplicate runner and no lost job; an agent whose web process dies goes on through the other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from runners.github.fake import FakeGitHub
from runners.github.programs import FAKE_RUNNER as FAKE_RUNNER_IMAGE
from tests import postgres_databases
from tests.e2e.harness import MANAGE, ROOT, free_port, kill_leftovers, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.any_database, pytest.mark.timeout(600)]

POSTGRES = os.environ.get("ZOOMIES_TEST_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test")
REDIS = "redis://127.0.0.1:6379/0"
POOL = {
    "name": "zoomies-scale",
    "labels": ["scale"],
    "backend": "process",
    "image": FAKE_RUNNER_IMAGE,
    "max_runners": 6,
}
LABELS = ["self-hosted", "scale"]


class Topology:
    """The processes of one scale-out installation on this machine."""

    def __init__(self, tmp: Path, fake: FakeGitHub) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        key = tmp / "app.pem"
        key.write_text(fake.private_key_pem)
        self.database = postgres_databases.create(POSTGRES)
        self.env = {
            **os.environ,
            "ZOOMIES_DATA_DIR": str(tmp / "data"),
            "ZOOMIES_DATABASE_URL": self.database,
            "ZOOMIES_REDIS_URL": REDIS,
            "ZOOMIES_SCHEDULER_HOST_THROTTLING": "false",  # as tests/e2e/harness.py says why
            "ZOOMIES_REDIS_PREFIX": f"zoomies-test-{uuid.uuid4().hex[:12]}",
            "ZOOMIES_DJANGO_SECRET": uuid.uuid4().hex * 2,
            "ZOOMIES_GITHUB_API_URL": fake.url,
            "ZOOMIES_GITHUB_APP_ID": str(fake.app_id),
            "ZOOMIES_GITHUB_PRIVATE_KEY_FILE": str(key),
            "ZOOMIES_GITHUB_WEBHOOK_SECRETS": "e2e-secret",
            "ZOOMIES_SCHEDULER_RECONCILE_INTERVAL": "1s",
            "ZOOMIES_HOUSEKEEPING_TICK": "2s",
            "ZOOMIES_GITHUB_POLL_INTERVAL": "5s",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("ZOOMIES_DB", None)
        self.processes: dict[str, subprocess.Popen] = {}
        self.token = ""

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, MANAGE, *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def spawn(self, name: str, *command: str) -> subprocess.Popen:
        log = (self.tmp / f"{name}.log").open("w")
        process = subprocess.Popen(list(command), env=self.env, cwd=ROOT, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-4000:]

    def api(self, path: str, method: str = "GET", **kwargs):
        headers = {"Authorization": f"Bearer {self.token}"}
        answer = httpx.request(
            method, f"{self.url}/api/v1/{path}", timeout=15, headers=headers, **kwargs
        )
        answer.raise_for_status()
        body = answer.json()
        return body["results"] if isinstance(body, dict) and "results" in body else body

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        kill_leftovers(str(self.tmp))
        postgres_databases.drop(POSTGRES, self.database.rsplit("/", 1)[1])


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def ticker_holder(topology: Topology) -> str:
    with psycopg.connect(topology.database) as db:
        row = db.execute("SELECT holder FROM zoomies_site_lease WHERE name = 'ticker'").fetchone()
    return row[0] if row else ""


def runner_names_per_job(fake, jobs) -> dict[int, str]:
    return {j: fake.job(j)["runner_name"] for j in jobs}


@pytest.fixture
def topology(tmp_path):
    fake = FakeGitHub(webhook_url=None, webhook_secret="e2e-secret").start()
    top = Topology(tmp_path, fake)
    fake.webhook_url = f"{top.url}/webhooks/github"
    try:
        yield top, fake
    finally:
        top.stop()
        fake.stop()


def start(top: Topology, fake: FakeGitHub) -> int:
    top.manage("migrate", "--verbosity", "0")
    top.token = top.manage("create_token", "--user", "e2e", "--create-user", "--scope",
                           "fleet:read", "--scope", "fleet:write").splitlines()[-1]  # fmt: skip
    installation = fake.add_installation(account="acme", account_type="Organization",
                                         repositories=["acme/app"])  # fmt: skip
    top.manage("add_installation", "--id", str(installation), "--account", "acme",
               "--repo", "acme/app")  # fmt: skip
    for n in (1, 2):
        top.spawn(f"web{n}", sys.executable, MANAGE, "web", "--bind",
                  f"127.0.0.1:{top.port}", "--reuse-port")  # fmt: skip
        top.spawn(f"workers{n}", sys.executable, MANAGE, "workers")
    wait_for(lambda: healthy(top.url), 60, f"the web tier on {top.url} ({top.log('web1')})")
    join = top.manage("create_join_token").splitlines()[-1]
    top.env["ZOOMIES_JOIN_TOKEN"] = join
    top.spawn("agent", sys.executable, "-m", "fleet.agent", "--controller", top.url,
              "--name", "scale-host", "--state-dir", str(top.tmp / "agent"),
              "--capacity", "6", "--backend", "process")  # fmt: skip
    top.env.pop("ZOOMIES_JOIN_TOKEN")
    wait_for(lambda: top.api("hosts"), 60, f"the agent to join ({top.log('agent')})")
    top.api("pools", method="POST", json=POOL)
    return installation


@pytest.mark.slow  # about 30 s of a worker: .ci/run's slow pass, after the test command
def test_store06_a_job_runs_end_to_end_on_two_web_and_two_worker_processes(topology):
    top, fake = topology
    start(top, fake)
    job = fake.queue_job(repo="acme/app", labels=LABELS, duration=1)
    wait_for(lambda: fake.job(job)["status"] == "completed", 120,
             f"the job to run ({top.log('workers1')})")  # fmt: skip
    wait_for(
        lambda: [j["status"] for j in top.api("jobs") if j["github_id"] == job] == ["completed"],
        60,
        "the installation to record it completed",
    )
    holders = {ticker_holder(top).split(":")[1]}
    assert holders <= {str(top.processes[f"workers{n}"].pid) for n in (1, 2)}
    for n in (1, 2):
        assert "Traceback" not in top.log(f"web{n}") + top.log(f"workers{n}")


@pytest.mark.slow  # a drill: .ci/run's slow pass, after the test command
def test_the_ticker_holder_killed_mid_burst_is_replaced_and_no_job_is_lost(topology):
    top, fake = topology
    start(top, fake)
    jobs = [fake.queue_job(repo="acme/app", labels=LABELS, duration=2) for _ in range(6)]
    wait_for(lambda: ticker_holder(top), 30, "a worker to hold the ticker")
    holder_pid = int(ticker_holder(top).split(":")[1])
    name = next(n for n, p in top.processes.items() if p.pid == holder_pid)
    os.killpg(holder_pid, signal.SIGKILL)  # the worker and its cluster, as the OOM killer
    killed_at = time.monotonic()
    jobs += [fake.queue_job(repo="acme/app", labels=LABELS, duration=2) for _ in range(6)]
    survivor = top.processes["workers2" if name == "workers1" else "workers1"].pid
    wait_for(lambda: ticker_holder(top).split(":")[1] == str(survivor), 40,
             "the other worker to take the ticker")  # fmt: skip
    took_over = time.monotonic() - killed_at
    wait_for(lambda: all(fake.job(j)["status"] == "completed" for j in jobs), 180,
             "every job to complete")  # fmt: skip
    names = runner_names_per_job(fake, jobs)
    assert len(set(names.values())) == len(jobs), "a runner ran two jobs"
    print(f"the ticker was taken over {took_over:.1f} s after its holder was killed")


@pytest.mark.slow  # a drill: .ci/run's slow pass, after the test command
def test_an_agent_whose_web_process_dies_goes_on_through_the_other(topology):
    top, fake = topology
    start(top, fake)
    os.killpg(top.processes["web1"].pid, signal.SIGKILL)
    top.processes["web1"].wait(10)
    job = fake.queue_job(repo="acme/app", labels=LABELS, duration=1)
    wait_for(lambda: fake.job(job)["status"] == "completed", 120,
             f"the job to run through web2 ({top.log('agent')})")  # fmt: skip
    assert healthy(top.url)
