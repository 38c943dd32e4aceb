"""The process backend's spawner (issue 28, the burst of 500): one warm interpreter per
agent forks each runner's supervisor, instead of a new interpreter started for every runner
while the host's one create slot waits. What the supervisor promised stays: its own
session, the exit code recorded, no stop lost in its start, the runner carrying on whatever
happens to the agent or the spawner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet.agent.backends.base import BackendError, RunnerSpec, WorkloadStatus
from fleet.agent.backends.process import (
    SHIM_FLAGS,
    SHIM_PATH,
    ProcessBackend,
    Spawner,
    SpawnRefused,
)
from fleet.agent.backends.process_shim import SPAWNER_FLAG, SPAWNER_NAME, SUPERVISOR_NAME
from tests.waiting import wait_until

SLEEPER = ["sleep", "30"]


def spec(runner_id: int, command: list[str]) -> RunnerSpec:
    return RunnerSpec(
        runner_id=runner_id, runner_name=f"r-{runner_id}", pool="p", backend="process",
        command=command, env={},
    )  # fmt: skip


@pytest.fixture
def backend(tmp_path: Path):
    made = ProcessBackend(tmp_path / "work", base_env={"PATH": os.environ["PATH"]})
    yield made
    for workload in made.list():
        made.remove(workload.runner_id)
    made.close()


def meta(backend: ProcessBackend, runner_id: int) -> dict:
    return json.loads((backend.run_dir(runner_id) / "meta.json").read_text())


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def spawner_pid(backend: ProcessBackend) -> int:
    process = backend._spawner._process
    assert process is not None
    return process.pid


def ended(backend: ProcessBackend, runner_id: int, timeout: float = 30):
    wait_until(lambda: backend.inspect(runner_id).status == WorkloadStatus.EXITED,
               timeout, f"runner {runner_id}'s end")  # fmt: skip
    return backend.inspect(runner_id)


def test_every_supervisor_is_forked_by_one_spawner_and_leads_a_session_of_its_own(backend):
    for rid in (1, 2, 3):
        backend.create(spec(rid, SLEEPER))
    spawner = spawner_pid(backend)
    assert SPAWNER_FLAG in Path(f"/proc/{spawner}/cmdline").read_text()
    assert Path(f"/proc/{spawner}/comm").read_text().strip() == SPAWNER_NAME
    for rid in (1, 2, 3):
        pid = meta(backend, rid)["pid"]
        # Its command line names the agent's work directory (what `ps` and the tests'
        # kill_leftovers look for), as the shim's own once named the runner's directory.
        assert str(backend.work_dir) in Path(f"/proc/{pid}/cmdline").read_text()
        assert Path(f"/proc/{pid}/comm").read_text().strip() == SUPERVISOR_NAME
        assert parent_of(pid) == spawner
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # killpg reaches it
        assert meta(backend, rid)["proc_start_time"] is not None
        assert backend.inspect(rid).status == WorkloadStatus.RUNNING


def test_a_killed_spawner_is_replaced_at_the_next_create_and_its_runners_carry_on(backend):
    backend.create(spec(1, SLEEPER))
    first = spawner_pid(backend)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: backend._spawner._process.poll() is not None, 10, "the spawner's death")
    backend.create(spec(2, SLEEPER))
    assert spawner_pid(backend) != first
    assert backend.inspect(1).status == WorkloadStatus.RUNNING
    backend.stop(1, timeout=10)  # its supervisor outlived its spawner and records the end
    assert ended(backend, 1).exit_code == 128 + signal.SIGTERM


def test_closing_the_backend_ends_the_spawner_and_no_runner(backend):
    backend.create(spec(1, SLEEPER))
    spawner = backend._spawner._process
    backend.close()
    assert spawner.poll() is not None
    assert backend.inspect(1).status == WorkloadStatus.RUNNING
    backend.stop(1, timeout=10)
    assert ended(backend, 1).exit_code == 128 + signal.SIGTERM


def test_an_ended_supervisor_leaves_no_zombie(backend):
    backend.create(spec(1, ["sh", "-c", "exit 5"]))
    assert ended(backend, 1).exit_code == 5
    pid = meta(backend, 1)["pid"]
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "the supervisor reaped")


def test_run11_a_stop_at_once_after_the_create_is_never_lost(backend):
    """The agent may stop a runner the instant its create returns: the supervisor then has
    its session, and the stop either keeps the runner from starting or reaches it."""
    for rid in range(1, 21):
        backend.create(spec(rid, SLEEPER))
        time.sleep((rid % 5) / 1000)
        backend.stop(rid, timeout=10)
        assert ended(backend, rid).exit_code == 128 + signal.SIGTERM, rid


def test_the_runner_does_not_inherit_the_interpreters_ignored_signals(backend):
    """Python ignores SIGPIPE and SIGXFSZ from its start, and an ignored signal stays ignored
    across exec: a job's `yes | head -1` then spun on EPIPE instead of ending."""
    backend.create(spec(1, ["sh", "-c", "grep SigIgn /proc/self/status"]))
    assert ended(backend, 1).exit_code == 0
    (line,) = [x for x in backend.logs(1).decode().splitlines() if x.startswith("SigIgn")]
    ignored = int(line.split()[1], 16)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (signum - 1)), (signum, line)
    backend.create(spec(2, ["sh", "-c", "yes | head -1"]))
    assert ended(backend, 2).exit_code == 0
    assert backend.logs(2).decode().strip() == "y"


def test_the_spawner_answers_a_bad_request_with_an_error_and_serves_the_next(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = {"run_dir": str(run_dir), "argv": ["sh", "-c", "exit 7"], "env": {"A": "b"}}
    lines = [
        b"not json\n",
        json.dumps({"run_dir": str(run_dir), "argv": "sh", "env": {}}).encode() + b"\n",
        json.dumps({**good, "run_dir": str(tmp_path / "missing")}).encode() + b"\n",
        json.dumps(good).encode() + b"\n",
    ]
    done = subprocess.run(
        [sys.executable, *SHIM_FLAGS, SHIM_PATH, SPAWNER_FLAG, str(tmp_path)],
        input=b"".join(lines),
        capture_output=True, env={"PATH": os.environ["PATH"]}, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [sorted(a) for a in answers] == [["error"], ["error"], ["error"], ["pid", "start"]]
    assert "FileNotFoundError" in answers[2]["error"]
    wait_until(lambda: (run_dir / "exit_code").exists(), 10, "the good request's runner")
    assert (run_dir / "exit_code").read_text().strip() == "7"


def test_a_spawner_that_ends_mid_request_fails_that_create_only(tmp_path):
    """Whether it forked before it died is unknown, so that create fails (the runner is
    replaced) rather than risk two supervisors; the next create starts a fresh spawner."""
    reads_one_and_dies = [sys.executable, "-c", "import sys; sys.stdin.readline()"]
    spawner = Spawner(reads_one_and_dies, env={"PATH": os.environ["PATH"]}, cwd=tmp_path)
    with pytest.raises(SpawnRefused, match="mid-request"):
        spawner.spawn(str(tmp_path), ["true"], {})
    first = spawner._process
    assert first is None  # discarded: the next spawn starts another
    with pytest.raises(SpawnRefused):
        spawner.spawn(str(tmp_path), ["true"], {})
    spawner.close()


# A spawner that forks a supervisor-like child (its stdout the runner's output file, a
# session of its own, then a sleep) and dies without answering.
DIES_AFTER_FORKING = """
import json, os, sys, time
request = json.loads(sys.stdin.readline())
if os.fork() == 0:
    os.setsid()
    log = os.open(os.path.join(request["run_dir"], "output.log"), os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 1)
    time.sleep(60)
    os._exit(0)
os._exit(9)
"""


def test_a_supervisor_forked_by_a_spawner_that_then_died_is_not_left_running(tmp_path):
    """Whether the spawner forked before it died is unknown to the agent: the create fails,
    and whatever writes to that runner's output file is found and ended with it."""
    backend = ProcessBackend(tmp_path / "work", base_env={"PATH": os.environ["PATH"]})
    backend._spawner.argv = [sys.executable, "-c", DIES_AFTER_FORKING]
    with pytest.raises(BackendError, match="mid-request"):
        backend.create(spec(1, SLEEPER))
    orphans = [
        entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()
        # " (deleted)" once the directory is gone
        and _stdout_of(entry).startswith(str(backend.run_dir(1) / "output.log"))
    ]  # fmt: skip
    assert orphans == []
    assert not backend.run_dir(1).exists()
    backend.close()


def _stdout_of(entry: Path) -> str:
    try:
        return os.readlink(entry / "fd" / "1")
    except OSError:
        return ""
