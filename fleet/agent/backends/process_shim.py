"""The process backend's supervisor: `python -I .../process_shim.py DIR -- ARGV...`.

It runs ARGV with its output appended to DIR/output.log and writes DIR/exit_code when the
child ends. The agent starts it in a session of its own, so an agent that restarts is no
longer its parent and can still learn how the runner ended by reading the file (AGENT-23).
Standard library only: it must start fast and import nothing the agent's host may lack.

The runner's environment (the allow-listed basics and the pool's `env`) arrives as JSON on
the shim's standard input, never on disk, and only the runner gets it: the shim itself runs
in the agent's allow-listed environment under `python -I`, so a pool's `PYTHONHOME` or
`PYTHONPATH` meant for the job cannot break the supervisor and lose the exit code (issue 21
item 13).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

EXIT_CODE_FILE = "exit_code"
OUTPUT_FILE = "output.log"
# The shell's convention: a child killed by signal N ended with 128 + N.
SIGNAL_EXIT_BASE = 128
NOT_FOUND_EXIT = 127
# The shim could not start the runner for want of its environment (the agent died mid-create).
BAD_START_EXIT = 126


def write_exit_code(run_dir: Path, code: int, *, only_if_missing: bool = False) -> None:
    """Written with tmp + rename, so a reader never sees half a number."""
    target = run_dir / EXIT_CODE_FILE
    if only_if_missing and target.exists():
        return
    tmp = run_dir / f".{EXIT_CODE_FILE}.{os.getpid()}"
    tmp.write_text(f"{code}\n")
    if only_if_missing:
        # link fails when the file appeared meanwhile: the shim's own answer wins.
        try:
            os.link(tmp, target)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return
    os.replace(tmp, target)


def read_runner_env(stream: BinaryIO) -> dict[str, str]:
    """The runner's environment, a JSON object of strings, read whole from `stream`."""
    try:
        env = json.loads(stream.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("not an object of strings")
    return env


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_received: list[int] = []


def _keep_running(signum: int, frame: object) -> None:
    """The group signal reaches the child too; the shim outlives it to record the exit code."""
    _received.append(signum)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: process_shim DIR -- ARGV...", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    command = argv[2:]
    try:
        runner_env = read_runner_env(sys.stdin.buffer)
    except ValueError as exc:
        with open(run_dir / OUTPUT_FILE, "ab") as log:
            log.write(f"zoomies: no environment for the runner: {exc}\n".encode())
        write_exit_code(run_dir, BAD_START_EXIT)
        return BAD_START_EXIT
    # A Python handler, not SIG_IGN: exec resets handlers but would pass SIG_IGN on to the
    # runner, which would then never hear a stop.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _keep_running)
    # The backend started us with these blocked, so a stop sent while Python was starting
    # waited for the handler; it is delivered now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if _received:
        # Stopped before the runner began: it never starts.
        code = SIGNAL_EXIT_BASE + _received[0]
        write_exit_code(run_dir, code)
        return code
    work = run_dir / "work"
    with open(run_dir / OUTPUT_FILE, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                command,
                env=runner_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=work if work.is_dir() else run_dir,
            )
        except OSError as exc:
            log.write(f"zoomies: cannot start {command[0]!r}: {exc}\n".encode())
            write_exit_code(run_dir, NOT_FOUND_EXIT)
            return NOT_FOUND_EXIT
        code = child.wait()
    if code < 0:
        code = SIGNAL_EXIT_BASE - code
    write_exit_code(run_dir, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
