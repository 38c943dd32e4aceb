"""The process backend's supervisor: `python -I -S .../process_shim.py DIR -- ARGV...`.

It runs ARGV with its output appended to DIR/output.log and writes DIR/exit_code when the
child ends. The agent starts it in a session of its own, so an agent that restarts is no
longer its parent and can still learn how the runner ended by reading the file (AGENT-23).

One of these starts for every runner, so it imports only what the interpreter has loaded
anyway (`os`, `sys`, the C half of `signal`): `json`, `subprocess`, `pathlib` and `signal`'s
enums were 60 % of its CPU (docs/performance.md, "The supervisor").

The runner's environment (the allow-listed basics and the pool's `env`) arrives on the
shim's standard input as `KEY=VALUE` entries each ended by a NUL byte (as
/proc/PID/environ holds them), never on disk, and only the runner gets it: the shim itself
runs in the agent's allow-listed environment under `python -I -S`, so a pool's `PYTHONHOME`
or `PYTHONPATH` meant for the job cannot break the supervisor and lose the exit code
(issue 21 item 13).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import BinaryIO
else:
    try:
        # The C module under `signal`, whose Python half imports enum for its names: a third
        # of what was left of the start. Only numbers are used here.
        import _signal as signal
    except ImportError:  # an interpreter without it
        import signal

EXIT_CODE_FILE = "exit_code"
OUTPUT_FILE = "output.log"
# The shell's convention: a child killed by signal N ended with 128 + N.
SIGNAL_EXIT_BASE = 128
NOT_FOUND_EXIT = 127
# The shim could not start the runner for want of its environment (the agent died mid-create).
BAD_START_EXIT = 126


def write_exit_code(
    run_dir: str | os.PathLike[str], code: int, *, only_if_missing: bool = False
) -> None:
    """Written with tmp + rename, so a reader never sees half a number."""
    target = os.path.join(run_dir, EXIT_CODE_FILE)
    if only_if_missing and os.path.exists(target):
        return
    tmp = os.path.join(run_dir, f".{EXIT_CODE_FILE}.{os.getpid()}")
    with open(tmp, "w") as out:
        out.write(f"{code}\n")
    if only_if_missing:
        # link fails when the file appeared meanwhile: the shim's own answer wins.
        try:
            os.link(tmp, target)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        return
    os.replace(tmp, target)


def encode_runner_env(env: dict[str, str]) -> bytes:
    """The runner's environment as the shim reads it: `KEY=VALUE\\0` for each variable."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"not an environment variable: {key!r}")
    return b"".join(f"{key}={value}\0".encode() for key, value in env.items())


def read_runner_env(stream: BinaryIO) -> dict[str, str]:
    """The runner's environment, read whole from `stream` (see encode_runner_env)."""
    data = stream.read()
    if data and not data.endswith(b"\0"):
        raise ValueError("cut short (the last entry has no NUL)")
    env = {}
    for entry in data.split(b"\0")[:-1]:
        key, equals, value = entry.partition(b"=")
        if not key or not equals:
            raise ValueError(f"not KEY=VALUE: {entry[:40]!r}")
        try:
            env[key.decode()] = value.decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 ({exc})") from None
    return env


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _keep_running(signum: int, frame: object) -> None:
    """The group signal reaches the child too; the shim outlives it to record the exit code
    (a stop before the runner exists is read from the pending set, `_pending_stop`)."""


def _pending_stop() -> int:
    """A stop signal waiting behind the block (0 for none)."""
    pending = signal.sigpending()
    return next((signum for signum in STOP_SIGNALS if signum in pending), 0)


def _say(log_fd: int, line: str) -> None:
    os.write(log_fd, f"zoomies: {line}\n".encode())


def _exec_runner(command: list[str], env: dict[str, str], cwd: str, log_fd: int) -> None:
    """In the forked child: the runner in place of this process, or exit NOT_FOUND_EXIT.

    First the stop signals' default action back and their block lifted: a stop the group
    got since the fork (pending here) ends this child at once, as it would have ended the
    runner, rather than run the shim's handler and be swallowed before the exec."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        os.chdir(cwd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.execvpe(command[0], command, env)  # noqa: S606  # the runner is argv, as Popen ran it
    except OSError as exc:
        _say(log_fd, f"cannot start {command[0]!r}: {exc}")
    finally:
        os._exit(NOT_FOUND_EXIT)  # reached only when exec failed


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: process_shim DIR -- ARGV...", file=sys.stderr)
        return 2
    run_dir = argv[0]
    command = argv[2:]
    log_fd = os.open(
        os.path.join(run_dir, OUTPUT_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
    )
    try:
        runner_env = read_runner_env(sys.stdin.buffer)
    except ValueError as exc:
        _say(log_fd, f"no environment for the runner: {exc}")
        write_exit_code(run_dir, BAD_START_EXIT)
        return BAD_START_EXIT
    # The backend starts us with the stop signals blocked (and they stay so here if it did
    # not), so none is lost between this process and a runner not yet there to hear it: one
    # sent so far waits, pending, and is looked at just before and just after the fork.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    # A Python handler, not SIG_IGN: exec resets handlers but would pass SIG_IGN on to the
    # runner, which would then never hear a stop.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _keep_running)
    early = _pending_stop()
    if early:
        # Stopped before the runner began: it never starts.
        code = SIGNAL_EXIT_BASE + early
        write_exit_code(run_dir, code)
        return code
    work = os.path.join(run_dir, "work")
    pid = os.fork()
    if pid == 0:
        _exec_runner(command, runner_env, work if os.path.isdir(work) else run_dir, log_fd)
    os.close(log_fd)
    late = _pending_stop()
    if late:
        # Sent in the instant before the fork, it reached this process alone: passed on
        # (sent after it, the runner got it too, and hears it twice within microseconds).
        os.kill(pid, late)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    # waitpid is retried after each stop signal's handler (PEP 475): the runner got the
    # group's signal too, and its end is what is recorded.
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = SIGNAL_EXIT_BASE - code
    write_exit_code(run_dir, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
