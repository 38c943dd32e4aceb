"""The process backend: a runner is a detached child in a directory of its own (HOST-07/08)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fleet.agent.backends.base import BackendError, RunnerSpec, WorkloadExists, WorkloadStatus
from fleet.agent.backends.process import KILL_WAIT, ProcessBackend, process_identity
from fleet.agent.host import cgroup_limits, local_size, platform_name, work_dir_space
from tests.waiting import wait_until

PY = sys.executable


def spec(runner_id: int, code: str, **env: str) -> RunnerSpec:
    return RunnerSpec(
        runner_id=runner_id,
        runner_name=f"zoomies-test-{runner_id}",
        pool="zoomies-linux-x64",
        backend="process",
        command=[PY, "-c", code],
        env=env,
    )


@pytest.fixture
def backend(tmp_path: Path):
    made = ProcessBackend(tmp_path / "work", base_env={**os.environ, "ZOOMIES_JOIN_TOKEN": "zjt_x"})
    yield made
    for workload in made.list():
        made.remove(workload.runner_id)
    made.close()


def exited(backend: ProcessBackend, runner_id: int):
    workload = backend.inspect(runner_id)
    return workload if workload.status == WorkloadStatus.EXITED else None


def test_a_runner_gets_its_own_directory_meta_log_and_exit_code(backend):
    code = "import os; print('hi', os.environ['JIT'], os.environ.get('ZOOMIES_JOIN_TOKEN'))"
    handle = backend.create(spec(5, code, JIT="jit-5"))

    run_dir = Path(handle.ref)
    assert run_dir == backend.work_dir / "runners" / "5"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["runner_id"] == 5 and meta["runner_name"] == "zoomies-test-5"
    assert meta["pool"] == "zoomies-linux-x64" and meta["argv"] == [PY, "-c", code]
    assert meta["pid"] > 0 and meta["proc_start_time"] > 0 and meta["started_at"] > 0
    assert "jit-5" not in json.dumps(meta), "the env (a JIT config) is never written down"

    workload = wait_until(lambda: exited(backend, 5))
    assert workload.exit_code == 0
    assert (run_dir / "exit_code").read_text().strip() == "0"
    # The task's env reaches the runner; the agent's join token does not.
    assert backend.logs(5) == b"hi jit-5 None\n"
    assert workload.log_ref == str(run_dir / "output.log")


def test_the_runner_runs_in_its_own_session(backend):
    backend.create(spec(6, "import time; time.sleep(30)"))
    meta = json.loads((backend.run_dir(6) / "meta.json").read_text())
    assert os.getsid(meta["pid"]) == meta["pid"] != os.getsid(0)
    assert [w.runner_id for w in backend.list()] == [6]
    assert backend.inspect(6).status == WorkloadStatus.RUNNING


def test_a_failing_command_records_its_exit_code(backend):
    backend.create(spec(7, "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"))
    assert wait_until(lambda: exited(backend, 7)).exit_code == 3
    assert b"boom" in backend.logs(7)


def test_a_second_create_for_one_runner_is_refused(backend):
    backend.create(spec(8, "import time; time.sleep(30)"))
    with pytest.raises(WorkloadExists):
        backend.create(spec(8, "print('second')"))


def test_an_unknown_command_fails_the_create(backend):
    bad = RunnerSpec(runner_id=9, runner_name="r", pool="p", backend="process", command=["nope-x"])
    with pytest.raises(BackendError, match="nope-x"):
        backend.create(bad)
    no_command = RunnerSpec(runner_id=9, runner_name="r", pool="p", backend="process")
    with pytest.raises(BackendError, match="has none"):
        backend.create(no_command)
    assert backend.list() == []


def test_stop_sends_sigterm_to_the_group(backend):
    backend.create(spec(10, "import time; time.sleep(30)"))
    backend.stop(10, timeout=5)
    assert backend.inspect(10).exit_code == 128 + signal.SIGTERM


def test_stop_kills_a_runner_that_ignores_sigterm_after_the_timeout(backend):
    code = (
        "import signal, time, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(30)"
    )
    backend.create(spec(11, code))
    wait_until(lambda: b"ready" in backend.logs(11))
    backend.stop(11, timeout=0.2)
    workload = backend.inspect(11)
    assert workload.status == WorkloadStatus.EXITED
    assert workload.exit_code == 128 + signal.SIGKILL


def test_remove_kills_and_deletes(backend):
    backend.create(spec(12, "import time; time.sleep(30)"))
    pid = json.loads((backend.run_dir(12) / "meta.json").read_text())["pid"]
    backend.remove(12)
    assert not backend.run_dir(12).exists()
    assert backend.inspect(12).status == WorkloadStatus.MISSING
    assert process_identity(pid) is None or process_identity(pid)[0] == "Z"
    backend.remove(12)  # a missing workload is fine


def test_a_reused_pid_is_not_mistaken_for_the_runner(backend):
    backend.create(spec(13, "print('done')"))
    wait_until(lambda: exited(backend, 13))
    meta_path = backend.run_dir(13) / "meta.json"
    meta = json.loads(meta_path.read_text())
    (backend.run_dir(13) / "exit_code").unlink()
    # Our own pid is alive, but it did not start when the runner did.
    meta["pid"] = os.getpid()
    meta["proc_start_time"] = process_identity(os.getpid())[1] + 1
    meta_path.write_text(json.dumps(meta))
    workload = backend.inspect(13)
    assert workload.status == WorkloadStatus.EXITED and workload.exit_code is None


def test_host07_probe_prefers_the_cgroup_limit(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/agent.slice/agent.service\n")
    (proc / "meminfo").write_text("MemTotal:       16384000 kB\nMemAvailable:    8000000 kB\n")
    cgroup = tmp_path / "cgroup"
    (cgroup / "agent.slice" / "agent.service").mkdir(parents=True)
    (cgroup / "agent.slice" / "agent.service" / "cpu.max").write_text("max 100000\n")
    (cgroup / "agent.slice" / "cpu.max").write_text("50000 100000\n")
    (cgroup / "agent.slice" / "agent.service" / "memory.max").write_text(f"{2048 * 1024**2}\n")

    assert cgroup_limits(cgroup, proc) == (0.5, 2048 * 1024**2)
    assert local_size(cgroup, proc) == (0.5, 2048)
    size = ProcessBackend(tmp_path / "work", cgroup_root=cgroup, proc_root=proc).probe()
    assert (size.cpus, size.memory_mb) == (0.5, 2048)


def test_host07_without_a_cgroup_limit_the_machine_counts(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/\n")
    (proc / "meminfo").write_text("MemTotal:       16384000 kB\n")
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup" / "memory.max").write_text("max\n")
    cpus, memory_mb = local_size(tmp_path / "cgroup", proc)
    assert cpus == float(len(os.sched_getaffinity(0)))
    assert memory_mb == 16384000 // 1024


def test_host07_platform_names():
    assert platform_name("x86_64") == "linux/x64"
    assert platform_name("AMD64") == "linux/x64"
    assert platform_name("aarch64") == "linux/arm64"
    assert platform_name("arm64") == "linux/arm64"


def test_host08_work_dir_space(tmp_path):
    space = work_dir_space(tmp_path)
    assert space is not None and space.total_mb > 0 and 0 <= space.free_mb <= space.total_mb
    assert work_dir_space(tmp_path / "absent") is None


# -- SEC-05: what a runner inherits from the agent ----------------------------------------

PRINT_ENV = "import json, os; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
CONTROLLER_SECRETS = {
    "ZOOMIES_SECRET_KEY": "sealing-key",
    "ZOOMIES_DATABASE_URL": "postgres://zoomies:pw@db/zoomies",
    "ZOOMIES_DJANGO_SECRET": "django-secret",
    "ZOOMIES_GITHUB_WEBHOOK_SECRETS": "hook-secret",
    "ZOOMIES_JOIN_TOKEN": "zjt_x",
}


def printed(backend: ProcessBackend, runner_id: int) -> dict:
    assert wait_until(lambda: exited(backend, runner_id)).exit_code == 0, backend.logs(runner_id)
    return json.loads(backend.logs(runner_id))


def test_sec05_a_runner_sees_none_of_the_agents_zoomies_variables_only_its_tasks_env(tmp_path):
    """SEC-05: the embedded agent's environment is the controller's; a job sees only the
    allow-listed basics and its own task's env (which may itself name ZOOMIES_* keys)."""
    agent_env = {
        **CONTROLLER_SECRETS,
        "PATH": os.environ["PATH"],
        "HOME": "/home/agent",
        "LANG": "C.UTF-8",
        "AWS_SECRET_ACCESS_KEY": "not-for-jobs",
        "DJANGO_SETTINGS_MODULE": "zoomies_site.settings",
    }
    backend = ProcessBackend(tmp_path / "work", base_env=agent_env)
    try:
        backend.create(spec(30, PRINT_ENV, JIT="jit-30", ZOOMIES_DOCKER_WAIT="180"))
        seen = printed(backend, 30)
    finally:
        backend.remove(30)
    env = seen["env"]
    assert env["JIT"] == "jit-30" and env["ZOOMIES_DOCKER_WAIT"] == "180"  # the task's own
    assert (env["PATH"], env["HOME"], env["LANG"]) == (os.environ["PATH"], "/home/agent", "C.UTF-8")
    leaked = {k for k in env if k.startswith("ZOOMIES_")} - {"ZOOMIES_DOCKER_WAIT"}
    assert leaked == set()
    assert "AWS_SECRET_ACCESS_KEY" not in env and "DJANGO_SETTINGS_MODULE" not in env
    for secret in CONTROLLER_SECRETS.values():
        assert secret not in json.dumps(env)


def test_sec05_by_default_the_agents_process_environment_is_filtered_too(tmp_path, monkeypatch):
    """SEC-05: without an explicit base_env the backend reads os.environ (the controller's,
    for the embedded agent) through the same allow-list; the runner's cwd is its own."""
    for key, value in CONTROLLER_SECRETS.items():
        monkeypatch.setenv(key, value)
    backend = ProcessBackend(tmp_path / "work")
    try:
        backend.create(spec(31, PRINT_ENV, JIT="jit-31"))
        seen = printed(backend, 31)
    finally:
        backend.remove(31)
    assert not [k for k in seen["env"] if k.startswith("ZOOMIES_")]
    assert seen["env"]["JIT"] == "jit-31"
    assert seen["cwd"] == str(backend.run_dir(31) / "work")


# -- stop: the grace first, then SIGTERM, then SIGKILL (RUN-11) ---------------------------


def test_run11_stop_first_waits_the_grace_for_the_runner_to_exit_on_its_own(backend):
    """RUN-11: a draining runner finishing its job within the grace is never signalled."""
    code = "import time; print('ready', flush=True); time.sleep(0.5); print('job done')"
    backend.create(spec(40, code))
    wait_until(lambda: b"ready" in backend.logs(40))
    backend.stop(40, timeout=5, grace=10)
    workload = backend.inspect(40)
    assert (workload.status, workload.exit_code) == (WorkloadStatus.EXITED, 0)
    assert b"job done" in backend.logs(40)


def record_stop_steps(backend: ProcessBackend, monkeypatch) -> list[tuple]:
    """What `stop` does, in order: each wait for the runner to go (how long, and whether it
    went) and each signal it sends, through the backend's own wait and signal."""
    steps: list[tuple] = []
    wait_gone, signal_group = backend._wait_gone, backend._signal_group

    def waited(runner_id: int, meta: dict, timeout: float) -> bool:
        gone = wait_gone(runner_id, meta, timeout)
        steps.append(("wait", timeout, gone))
        return gone

    def signalled(meta: dict, signum: int) -> None:
        steps.append((signal.Signals(signum).name,))
        signal_group(meta, signum)

    monkeypatch.setattr(backend, "_wait_gone", waited)
    monkeypatch.setattr(backend, "_signal_group", signalled)
    return steps


def test_run11_after_the_grace_stop_sends_sigterm_then_sigkill_after_the_timeout(
    backend, monkeypatch
):
    """RUN-11: a job still running when the grace ends is stopped: SIGTERM, and SIGKILL once
    `timeout` has passed after it."""
    steps = record_stop_steps(backend, monkeypatch)
    backend.create(spec(41, "print('ready', flush=True); import time; time.sleep(30)"))
    wait_until(lambda: b"ready" in backend.logs(41))
    backend.stop(41, timeout=5, grace=0.4)
    # The whole grace was waited out with the runner still there, and only then SIGTERM.
    assert steps == [("wait", 0.4, False), ("SIGTERM",), ("wait", 5, True)]
    assert backend.inspect(41).exit_code == 128 + signal.SIGTERM
    steps.clear()

    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(30)"
    )
    backend.create(spec(42, stubborn))
    wait_until(lambda: b"ready" in backend.logs(42))
    backend.stop(42, timeout=0.3, grace=0.3)
    assert steps == [
        ("wait", 0.3, False),  # the grace
        ("SIGTERM",),
        ("wait", 0.3, False),  # the timeout, SIGTERM ignored
        ("SIGKILL",),
        ("wait", KILL_WAIT, True),
    ]
    assert backend.inspect(42).exit_code == 128 + signal.SIGKILL


def test_a_pools_python_variables_reach_the_runner_but_cannot_break_its_supervisor(tmp_path):
    """Issue 21 item 13: a pool's env is the runner's alone. `PYTHONHOME=/nonexistent` meant
    for the job used to reach the supervisor too, which could not start, and the runner's
    exit code was lost. Now the supervisor starts in the allow-listed basics under
    `python -I`, the runner sees the pool's values, and its exit code is recorded."""
    backend = ProcessBackend(tmp_path / "work", base_env={"PATH": os.environ["PATH"]})
    shell = (
        'echo "home=$PYTHONHOME path=$PYTHONPATH jit=$JIT"; '
        'test "$PYTHONHOME" = /nonexistent && exit 3'
    )
    backend.create(
        RunnerSpec(
            runner_id=40,
            runner_name="r-40",
            pool="p",
            backend="process",
            command=["sh", "-c", shell],
            env={"PYTHONHOME": "/nonexistent", "PYTHONPATH": "/nowhere", "JIT": "jit-40"},
        )
    )
    deadline = time.monotonic() + 30
    while (workload := backend.inspect(40)).status != WorkloadStatus.EXITED:
        assert time.monotonic() < deadline, "the runner never ended"
        time.sleep(0.05)
    assert workload.exit_code == 3  # the runner's own code, recorded by its supervisor
    output = (backend.run_dir(40) / "output.log").read_text()
    assert "home=/nonexistent path=/nowhere jit=jit-40" in output
    assert "jit-40" not in "".join(p.read_text() for p in backend.run_dir(40).glob("*.json"))
