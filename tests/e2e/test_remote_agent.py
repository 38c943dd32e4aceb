"""A remote agent in its own process: it joins, runs jobs, and is given up on when killed.

The controller here is the test's own live server (real HTTP on loopback), so the test can
drive the housekeeping tick with a moved clock. The agent is installed as an operator
installs it on another host (ARCH-05, issue 7 item 5): the project's wheel in a fresh
virtualenv with only the agent's own dependencies (fleet/agent/requirements.txt), where
Django cannot be imported, started as the `zoomies-agent` console script with a join token
and nothing of the controller's configuration (no database settings, no secret key).
"""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.actions import create_join_token
from fleet.models import Host
from runners import reconcile
from runners.github.programs import FAKE_RUNNER
from runners.housekeeping import housekeeping_step
from runners.models import Job, Runner
from tests.e2e.harness import kill_leftovers, wait_for
from tests.e2e.live_github import fake_github_for
from tests.fleet.agent.install import AgentInstall, install_agent_only

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
LABELS = ["self-hosted", "remote"]


@pytest.fixture
def github(live_server, tmp_path, monkeypatch):
    with fake_github_for(
        live_server.url,
        tmp_path,
        monkeypatch,
        secret="remote-secret",
        name="zoomies-remote",
        labels=["remote"],
        backend="process",
        image=FAKE_RUNNER,
    ) as fake:
        yield fake


@pytest.fixture(scope="module")
def agent_install(tmp_path_factory) -> AgentInstall:
    return install_agent_only(tmp_path_factory.mktemp("agent-host"))


def agent_environment(join_token: str) -> dict[str, str]:
    """What an operator gives a host's agent: a join token, and nothing of the controller."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "ZOOMIES_JOIN_TOKEN": join_token,
        "PYTHONUNBUFFERED": "1",
    }


def test_arch05_the_agent_host_has_no_django_and_no_controller_settings(agent_install):
    """ARCH-05: the installed agent imports, and Django is not importable beside it."""
    assert "django" not in agent_install.distributions
    assert {"httpx", "docker"} <= set(agent_install.distributions)
    probe = (
        "import importlib.util, sys, fleet.agent.cli, fleet.agent.backends.process, "
        "fleet.protocol; "
        "print(importlib.util.find_spec('django'), importlib.util.find_spec('rest_framework'), "
        "[m for m in sys.modules if m.split('.')[0] in ('django', 'zoomies_site', 'runners')])"
    )
    done = subprocess.run(
        [agent_install.python, "-c", probe],
        env=agent_environment("zjt_unused"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None None []"
    usage = subprocess.run(
        [agent_install.script, "--help"], capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 0 and "--controller" in usage.stdout and "--ca-file" in usage.stdout


@pytest.fixture
def remote_agent(live_server, tmp_path, agent_install):
    _row, join_token = create_join_token(now=timezone.now(), actor="test")
    state_dir = tmp_path / "remote-agent"
    env = agent_environment(join_token)
    assert not [k for k in env if k.startswith(("DJANGO", "ZOOMIES_DATABASE", "ZOOMIES_SECRET"))]
    log = (tmp_path / "agent.log").open("w")
    process = subprocess.Popen(
        [agent_install.script, "--controller", live_server.url, "--state-dir", str(state_dir),
         "--name", "zoomies-remote-1", "--capacity", "2"],
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)
    kill_leftovers(str(state_dir))


def drive_until(predicate, timeout: float, what: str):
    """The controller's ticker, in miniature: reconcile passes until `predicate()` holds."""

    def step():
        reconcile.reconcile_now()
        return predicate()

    return wait_for(step, timeout, what, every=0.3)


def test_arch08_host04_a_remote_agent_runs_jobs_then_is_lost_when_killed(github, remote_agent):
    """ARCH-01, ARCH-07, ARCH-08, AUTH-08, HOST-03, HOST-04, RUN-16: join with a join token,
    run a job, then SIGKILL: unhealthy after the heartbeat timeout, lost after 5 min with its
    runners failed and the running job marked, judged on a moved clock."""
    host = wait_for(
        lambda: Host.objects.filter(name="zoomies-remote-1").first(), 30, "the agent to join"
    )
    assert host.capacity == 2 and "process" in host.backends

    first = github.queue_job(repo="acme/app", labels=LABELS, duration=0.3)
    drive_until(lambda: github.job(first)["status"] == "completed", 60, "the first job to run")

    long_job = github.queue_job(repo="acme/app", labels=LABELS, duration=600)
    # The runner can report busy before the job's own webhook lands (GitHub hands a queued job
    # to any idle runner that matches), so wait for the job's row to name its runner.
    bound = drive_until(
        lambda: Job.objects.filter(github_id=long_job, runner__isnull=False).first(),
        60,
        "the long job bound to a runner",
    )
    busy = drive_until(
        lambda: Runner.objects.filter(pk=bound.runner_id, state="busy", host=host).first(),
        60,
        "its runner busy on the remote host",
    )

    remote_agent.send_signal(signal.SIGKILL)
    remote_agent.wait(timeout=10)
    last_beat = Host.objects.get(pk=host.pk).last_heartbeat_at

    housekeeping_step(last_beat + timedelta(seconds=89))
    assert Host.objects.get(pk=host.pk).health == "healthy"

    housekeeping_step(last_beat + timedelta(seconds=91))
    assert Host.objects.get(pk=host.pk).health == "unhealthy"
    busy.refresh_from_db()
    assert busy.state == "busy", "an unhealthy host's runners are not failed yet"
    # Nothing new is placed on an unhealthy host.
    github.queue_job(repo="acme/app", labels=LABELS, duration=1)
    wait_for(lambda: Job.objects.filter(status="queued").exists(), 10, "the new job")
    reports = reconcile.reconcile_now()
    assert not any(r.created for r in reports)
    assert not Runner.objects.filter(host=host, state="provisioning").exists()

    housekeeping_step(last_beat + timedelta(minutes=5, seconds=1))
    assert Host.objects.get(pk=host.pk).health == "lost"
    busy.refresh_from_db()
    assert busy.state == "failed"
    assert "lost" in busy.message
    assert Job.objects.get(github_id=long_job).fleet_failure


def process_tree(root: int) -> set[int]:
    """`root` and every process descended from it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree


def listening_sockets(pids: set[int]) -> list[str]:
    """TCP and UDP sockets held by `pids` that wait for someone to connect (TCP LISTEN, or
    any bound UDP socket), as "proto port"."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = open(f"/proc/net/{proto}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode in inodes and (state == "0A" or proto.startswith("udp")):
                found.append(f"{proto} {int(local.rsplit(':', 1)[1], 16)}")
    return found


def test_arch06_no_agent_or_runner_waits_for_a_connection_and_no_host_has_an_address(
    github, remote_agent
):
    """ARCH-06: with a runner busy on the remote host, neither its agent nor anything the
    agent started listens on a port (every connection is theirs, outward), and a host's row
    holds no address the controller could dial."""
    host = wait_for(
        lambda: Host.objects.filter(name="zoomies-remote-1").first(), 30, "the agent to join"
    )
    job = github.queue_job(repo="acme/app", labels=LABELS, duration=600)
    bound = drive_until(
        lambda: Job.objects.filter(github_id=job, runner__isnull=False).first(),
        60,
        "the job bound to a runner",
    )
    drive_until(lambda: Runner.objects.filter(pk=bound.runner_id, state="busy").exists(), 60,
                "its runner busy")  # fmt: skip
    tree = process_tree(remote_agent.pid)
    assert len(tree) >= 2, "the runner's process should be under its agent"
    assert listening_sockets(tree) == []
    assert listening_sockets({os.getpid()}), "the check must see this test's own live server"
    columns = {f.name for f in Host._meta.get_fields()}
    assert not {c for c in columns if any(w in c for w in ("address", "ip", "port", "url"))}
    assert host.health == "healthy"
