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
INTERPRETER_IGNORED = (signal.SIGPIPE, signal.SIGXFSZ)
SPAWNER_FLAG = "--spawner"
# What `ps -o comm` and /proc/PID/comm say of each (15 bytes at most): the supervisors keep
# the spawner's command line, so this is what tells the two apart.
SPAWNER_NAME = "zoomies-spawner"
SUPERVISOR_NAME = "zoomies-superv"


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
    # Python ignores these two at its start, and an ignored signal stays ignored across exec:
    # the job's `yes | head -1` would then spin on EPIPE instead of ending.
    for signum in INTERPRETER_IGNORED:
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


def supervise(run_dir: str, command: list[str], runner_env: dict[str, str], log_fd: int) -> int:
    """Run `command` to its end and record its exit code; the supervisor's whole life.

    `log_fd` (the output file, opened for appending) is the runner's stdout and stderr and
    is closed here once the runner has it."""
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


def _open_log(run_dir: str) -> int:
    return os.open(
        os.path.join(run_dir, OUTPUT_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
    )


def main(argv: list[str]) -> int:
    if argv[:1] == [SPAWNER_FLAG]:
        # The rest names the agent's work directory, for `ps` alone: each supervisor forked
        # from here keeps this command line, which then says whose runner it serves.
        return serve()
    if len(argv) < 3 or argv[1] != "--":
        print(
            "usage: process_shim DIR -- ARGV...  |  process_shim --spawner WORK_DIR",
            file=sys.stderr,
        )
        return 2
    run_dir = argv[0]
    command = argv[2:]
    log_fd = _open_log(run_dir)
    try:
        runner_env = read_runner_env(sys.stdin.buffer)
    except ValueError as exc:
        _say(log_fd, f"no environment for the runner: {exc}")
        write_exit_code(run_dir, BAD_START_EXIT)
        return BAD_START_EXIT
    return supervise(run_dir, command, runner_env, log_fd)


# -- the spawner ---------------------------------------------------------------------------


def serve(requests: BinaryIO | None = None, answers_fd: int = 1) -> int:
    """`process_shim.py --spawner WORK_DIR`: the agent's one warm interpreter that forks
    each runner's supervisor, instead of a new interpreter started for every runner (7 to
    10 CPU-ms each, and the host's one create slot held meanwhile: issue 28, the burst of
    500).

    Each request is a JSON line {"run_dir", "argv", "env"}; each answer a JSON line
    {"pid", "start"} once the supervisor leads a session of its own (so the agent's killpg
    reaches it at once), or {"error"}. The supervisors are the spawner's children, reaped by
    the kernel (SIGCHLD ignored here), and carry on when it ends: it ends when the agent
    closes its input or dies, and the agent starts another at its next create.
    """
    import json  # noqa: PLC0415  # the spawner's alone, paid once in its life

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _name_this_process(SPAWNER_NAME)
    for line in requests or sys.stdin.buffer:
        try:
            request = json.loads(line)
            run_dir, command, env = request["run_dir"], request["argv"], request["env"]
            if not (
                isinstance(run_dir, str)
                and isinstance(command, list)
                and command
                and all(isinstance(a, str) for a in command)
                and isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
            ):
                raise ValueError("not a spawn request")
            pid, start = _fork_supervisor(run_dir, command, env)
            answer: dict[str, object] = {"pid": pid, "start": start}
        except (ValueError, KeyError, TypeError, OSError) as exc:
            answer = {"error": f"{exc.__class__.__name__}: {exc}"}
        os.write(answers_fd, (json.dumps(answer) + "\n").encode())
    return 0


def _name_this_process(name: str) -> None:
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)
    except OSError:
        pass  # no /proc here: only `ps` is the poorer for it


def _fork_supervisor(
    run_dir: str, command: list[str], env: dict[str, str]
) -> tuple[int, int | None]:
    """Fork one supervisor; (its pid, its start time in clock ticks) once it has its own
    session, its output file as stdout and stderr and the stop signals blocked (as the
    backend's Popen of the shim gave them)."""
    log_fd = _open_log(run_dir)
    ready_r, ready_w = os.pipe()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for fd in (log_fd, ready_r, ready_w):
            os.close(fd)
        raise
    if pid == 0:
        _supervisor_child(run_dir, command, env, log_fd, ready_r, ready_w)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    os.close(ready_w)
    os.close(log_fd)
    said = b""
    while chunk := os.read(ready_r, 64):
        said += chunk
    os.close(ready_r)
    return pid, int(said) if said.isdigit() else None


def _supervisor_child(
    run_dir: str, command: list[str], env: dict[str, str], log_fd: int, ready_r: int, ready_w: int
) -> None:
    """In the forked supervisor: never returns."""
    code = BAD_START_EXIT
    try:
        os.close(ready_r)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own waitpid needs its runner
        os.setsid()
        _name_this_process(SUPERVISOR_NAME)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        with open(f"/proc/{os.getpid()}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        os.write(ready_w, fields[19] if len(fields) > 19 else b"")
        os.close(ready_w)  # the spawner answers the agent now
        code = supervise(run_dir, command, env, log_fd)
    except BaseException as exc:  # whatever it was, the exit code is owed
        try:
            _say(2, f"the runner's supervisor failed: {exc!r}")
            write_exit_code(run_dir, code, only_if_missing=True)
        except BaseException:  # noqa: S110  # nothing is left to tell
            pass
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
