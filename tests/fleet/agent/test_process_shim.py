"""The process backend's supervisor (fleet/agent/backends/process_shim.py), run as the agent
runs it: `python -I process_shim.py DIR -- ARGV...` with the runner's environment on stdin."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from fleet.agent.backends import process_shim
from fleet.agent.backends.process import SHIM_FLAGS, SHIM_PATH, shim_argv
from fleet.agent.backends.process_shim import encode_runner_env, read_runner_env


def run_shim(run_dir, command: list[str], stdin: bytes) -> tuple[int, str, str]:
    done = subprocess.run(
        shim_argv(sys.executable, str(run_dir), command),
        input=stdin,
        capture_output=True,
        env={"PATH": os.environ["PATH"]},
        timeout=30,
    )
    written = (run_dir / "exit_code").read_text()
    return done.returncode, written.strip(), (run_dir / "output.log").read_text()


def test_an_environment_survives_the_trip_whatever_its_values_hold():
    env = {"PATH": "/usr/bin:/bin", "EQ": "a=b=c", "LINES": "one\ntwo", "UTF": "zoomies ✓", "E": ""}
    assert read_runner_env(io.BytesIO(encode_runner_env(env))) == env
    assert read_runner_env(io.BytesIO(b"")) == {}


@pytest.mark.parametrize("env", [{"": "x"}, {"A=B": "x"}, {"NUL\0": "x"}, {"K": "nul\0inside"}])
def test_a_variable_no_process_could_hold_is_refused_before_any_start(env):
    with pytest.raises(ValueError, match="not an environment variable"):
        encode_runner_env(env)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"A=1\0B=2", "cut short"),  # the agent died mid-write
        (b"A=1\0NOEQUALS\0", "not KEY=VALUE"),
        (b"=1\0", "not KEY=VALUE"),
        (b"A=\xff\0", "not UTF-8"),
        (b'{"PATH": "/bin"}', "cut short"),  # the JSON an older agent sent
    ],
)
def test_a_damaged_environment_is_a_clear_refusal(data, why):
    with pytest.raises(ValueError, match=why):
        read_runner_env(io.BytesIO(data))


def test_the_runner_gets_exactly_its_environment_and_its_code_is_recorded(tmp_path):
    (tmp_path / "work").mkdir()
    env = {"PATH": os.environ["PATH"], "JIT": "a=b", "MULTI": "x\ny"}
    code, written, output = run_shim(
        tmp_path,
        ["sh", "-c", 'pwd; env | sort; test "$MULTI" = "$(printf "x\\ny")" && exit 7'],
        encode_runner_env(env),
    )
    assert (code, written) == (7, "7")
    lines = output.splitlines()
    assert lines[0] == str(tmp_path / "work")  # its working directory
    assert "JIT=a=b" in lines
    assert not [line for line in lines if line.startswith("PYTHON")]


def test_a_runner_that_cannot_be_started_is_127_with_the_reason_in_its_log(tmp_path):
    code, written, output = run_shim(
        tmp_path, [str(tmp_path / "gone")], encode_runner_env({"PATH": "/bin"})
    )
    assert (code, written) == (process_shim.NOT_FOUND_EXIT, "127")
    assert f"cannot start {str(tmp_path / 'gone')!r}" in output


def test_a_shim_whose_environment_was_cut_short_starts_nothing_and_says_so(tmp_path):
    marker = tmp_path / "ran"
    code, written, output = run_shim(tmp_path, ["touch", str(marker)], b"PATH=/bin")
    assert (code, written) == (process_shim.BAD_START_EXIT, "126")
    assert "no environment for the runner: cut short" in output
    assert not marker.exists()


def test_a_runner_killed_by_a_signal_is_recorded_as_the_shell_would(tmp_path):
    code, written, _ = run_shim(
        tmp_path, ["sh", "-c", "kill -KILL $$"], encode_runner_env({"PATH": os.environ["PATH"]})
    )
    assert (code, written) == (128 + 9, "137")


def test_the_shim_imports_only_what_the_interpreter_has_loaded_anyway():
    """Its start is paid once a runner: no json, subprocess, pathlib, typing or enum, and
    under the backend's flags not even `site` (three of the bare interpreter's ten ms)."""
    code = (
        "import sys; before = set(sys.modules); "
        f"import importlib.util as u; s = u.spec_from_file_location('shim', {SHIM_PATH!r}); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); "
        "print(sorted(set(sys.modules) - before))"
    )
    done = subprocess.run(
        [sys.executable, *SHIM_FLAGS, "-c", f"{code}; print('site' in sys.modules)"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    added_line, site_line = done.stdout.splitlines()
    added = set(eval(added_line))  # noqa: S307  # our own print of a list of names
    assert not added & {"json", "subprocess", "pathlib", "typing", "re", "enum"}, added
    assert site_line == "False"


def test_run11_a_stop_at_any_moment_of_the_start_ends_the_runner_never_lost(tmp_path):
    """A stop sent to the group while the shim starts, checks, forks or execs: the runner
    either never starts or hears it, and the shim records 143 either way. The child's
    window between the fork and the exec once swallowed it in the shim's handler, and the
    runner ran on to the SIGKILL (137; CI's test_run11_a_stop_without_a_grace_...)."""
    env = encode_runner_env({"PATH": os.environ["PATH"]})
    delays = [i / 1000 for i in range(40)]  # 0 to 39 ms: Python's start is about 15
    for n, delay in enumerate(delays):
        run_dir = tmp_path / str(n)
        run_dir.mkdir()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, process_shim.STOP_SIGNALS)
        try:
            shim = subprocess.Popen(
                shim_argv(sys.executable, str(run_dir), ["sleep", "30"]),
                stdin=subprocess.PIPE, env={"PATH": os.environ["PATH"]},
                start_new_session=True,
            )  # fmt: skip
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        shim.stdin.write(env)
        shim.stdin.close()
        time.sleep(delay)
        os.killpg(shim.pid, signal.SIGTERM)
        try:
            shim.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(shim.pid, signal.SIGKILL)
            shim.wait()
            pytest.fail(f"a stop {delay * 1000:.0f} ms into the start was lost: the runner ran on")
        assert (run_dir / "exit_code").read_text() == "143\n", delay
