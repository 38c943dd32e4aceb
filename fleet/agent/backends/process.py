"""The process backend: each runner is a detached child process in a directory of its own.

    <work_dir>/runners/<runner_id>/
        meta.json    runner_id, runner_name, pool, argv, started_at, pid, proc_start_time
        output.log   the runner's stdout and stderr
        exit_code    written by the shim when the runner ends
        work/        the runner's working directory

The runner is started by its supervisor (process_shim.supervise) in a session of its own,
so it survives an agent restart and its exit code is still learned from the file
(AGENT-23). The supervisors are forked by the agent's one spawner (`process_shim.py
--spawner`, `Spawner` below), a warm interpreter, rather than each started as a new one.

What a runner gets from the agent (SEC-05): its environment is built from an allow-list of
the agent's own variables (`INHERITED_ENV`: the path, the locale, the user and their home)
plus the task's `env`, and nothing else. The embedded agent runs inside the controller, so
its environment holds the controller's secrets (ZOOMIES_SECRET_KEY, ZOOMIES_DATABASE_URL,
webhook secrets): no variable of the agent's reaches a job unless it is on the list, and no
ZOOMIES_* one ever does. The runner's working directory is its own `work/`.

The limit of this backend: a runner is a process of the agent's own user. Nothing between
two processes of one user stops the job from reading what that user can read -- the agent's
state directory, and for the embedded agent the controller's data directory beside it (the
database, the sealing key). Use the process backend only on a trusted, single-tenant host
(a job is as trusted as the operator); the container backends are what isolate a job.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fleet.agent.backends.base import (
    Backend,
    BackendError,
    Handle,
    HostSize,
    LogFollow,
    RunnerSpec,
    Workload,
    WorkloadExists,
    WorkloadStatus,
)
from fleet.agent.backends.process_shim import (
    EXIT_CODE_FILE,
    OUTPUT_FILE,
    SIGNAL_EXIT_BASE,
    SPAWNER_FLAG,
    encode_runner_env,
    write_exit_code,
)
from fleet.agent.host import local_size, platform_name

META_FILE = "meta.json"
# The shim runs as a script under `python -I -S` (standard library only): isolated from the
# PYTHON* variables and the user's site, needing no sys.path entry for our package, and
# without `site` at all (it imports nothing from site-packages): 7.3 CPU-ms for the bare
# interpreter here against 10.3 with `site`, paid once a runner.
SHIM_PATH = str(Path(__file__).resolve().with_name("process_shim.py"))
SHIM_FLAGS = ("-I", "-S")


def shim_argv(python: str, run_dir: str, command: list[str]) -> list[str]:
    """The shim's standalone mode, one interpreter for one runner (its environment on
    standard input): what the spawner's supervisors run, `process_shim.supervise`, without
    the spawner. The agent uses the spawner; the shim's own tests start it this way."""
    return [python, *SHIM_FLAGS, SHIM_PATH, run_dir, "--", *command]


# SEC-05: the only variables of the agent's own environment a runner inherits. Everything
# else (above all ZOOMIES_*, the controller's secrets when the agent is embedded) stays out;
# a runner needs more only through its task's `env`.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL")
KILL_WAIT = 5.0
# How much of a runner's output its end report carries (the protocol's MAX_OUTPUT_TAIL).
OUTPUT_TAIL_BYTES = 64 * 1024
POLL_INTERVAL = 0.05
# A followed output file is read this much at a time, and looked at again this often once
# the reader has caught up with the runner.
FOLLOW_READ = 32 * 1024
FOLLOW_POLL = 0.2


# How long a create waits for the spawner's answer: a fork and a pipe's round trip, far less
# than a second even on a loaded host; past this the spawner is taken for stuck.
SPAWN_ANSWER_TIMEOUT = 30.0


class SpawnRefused(Exception):
    """No supervisor was started for this request; with `uncertain`, the spawner ended with
    the request read, and one may have been."""

    def __init__(self, message: str, *, uncertain: bool = False) -> None:
        super().__init__(message)
        self.uncertain = uncertain


class Spawner:
    """The agent's one `process_shim.py --spawner` (process_shim.serve), started at the first
    create and again after it ended. Creates are one at a time per host (AGENT-01), and the
    lock keeps the pipe's requests and answers paired besides."""

    def __init__(self, argv: list[str], *, env: Mapping[str, str], cwd: Path) -> None:
        self.argv = argv
        self.env = dict(env)
        self.cwd = cwd
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def spawn(
        self, run_dir: str, command: list[str], env: dict[str, str]
    ) -> tuple[int, int | None]:
        """Fork a supervisor for `command`; (its pid, its start time) once it leads its own
        session. SpawnRefused when none was started."""
        request = (json.dumps({"run_dir": run_dir, "argv": command, "env": env}) + "\n").encode()
        with self._lock:
            for fresh in (False, True):
                process = self._running()
                try:
                    assert process.stdin is not None  # noqa: S101  # stdin=PIPE
                    process.stdin.write(request)
                    process.stdin.flush()
                    break
                except OSError as exc:
                    # It had ended before this request, so nothing of it was read: once more
                    # on a fresh one.
                    self._discard()
                    if fresh:
                        raise SpawnRefused(f"the spawner does not take requests: {exc}") from exc
            line = self._answer(process)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = {"error": f"an answer that is not JSON: {line[:80]!r}"}
        if not isinstance(answer, dict) or not isinstance(answer.get("pid"), int):
            raise SpawnRefused(str(answer.get("error") if isinstance(answer, dict) else answer))
        start = answer.get("start")
        return answer["pid"], start if isinstance(start, int) else None

    def _answer(self, process: subprocess.Popen[bytes]) -> bytes:
        assert process.stdout is not None  # noqa: S101  # stdout=PIPE
        ready, _, _ = select.select([process.stdout], [], [], SPAWN_ANSWER_TIMEOUT)
        line = process.stdout.readline() if ready else b""
        if not line:
            # Ended or stuck with the request read: whether it forked is unknown, so this
            # create fails (the runner is replaced) and the next one starts a fresh spawner.
            self._discard()
            raise SpawnRefused("the spawner ended or stopped answering mid-request", uncertain=True)
        return line

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._discard()
        try:
            self._process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # the agent's group signals never reach it
                close_fds=True,
            )
        except OSError as exc:
            raise SpawnRefused(f"cannot start the spawner: {exc}") from exc
        return self._process

    def _discard(self) -> None:
        process, self._process = self._process, None
        _end(process, grace=0.0)

    def close(self) -> None:
        """End the spawner (its input closed: it exits); the supervisors carry on."""
        with self._lock:
            process, self._process = self._process, None
        _end(process, grace=5.0)


def _end(process: subprocess.Popen[bytes] | None, *, grace: float) -> None:
    """Close a spawner's input, give it `grace` seconds to exit, then kill it; reaped."""
    if process is None:
        return
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    if process.poll() is None:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


# How long a supervisor forked by a spawner that then died is given to take its output file
# as its stdout (it does so first thing) before the file's writers are looked for.
ORPHAN_SETTLE = 0.2


def kill_writers_of(path: Path, proc_root: Path = Path("/proc")) -> list[int]:
    """SIGKILL, with its process group, every process whose stdout is `path`; their pids."""
    target, killed = str(path), []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "fd" / "1") != target:
                continue
            pid = int(entry.name)
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            continue  # gone meanwhile, or not ours to look at
    return killed


def process_identity(pid: int, proc_root: Path = Path("/proc")) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from /proc/<pid>/stat, or None."""
    try:
        raw = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses; everything after the last ")" is fixed.
    fields = raw.rpartition(")")[2].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


class ProcessBackend(Backend):
    """Runs each runner's command as a child process under `<work_dir>/runners/`.

    For trusted single-tenant hosts only: the runner runs as the agent's user, so it is kept
    from the agent's secrets by its environment (an allow-list) but not by file permissions.
    """

    name = "process"

    def __init__(
        self,
        work_dir: Path | str,
        *,
        python: str = sys.executable,
        base_env: Mapping[str, str] | None = None,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.work_dir = Path(work_dir)
        self.runners_dir = self.work_dir / "runners"
        self.python = python
        self.base_env = runner_base_env(os.environ if base_env is None else base_env)
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        self._spawner = Spawner(
            [python, *SHIM_FLAGS, SHIM_PATH, SPAWNER_FLAG, str(self.work_dir)],
            env=self.base_env,
            cwd=self.work_dir,
        )
        self._lock = threading.Lock()

    # -- the interface --------------------------------------------------------------------

    def create(self, spec: RunnerSpec) -> Handle:
        if not spec.command:
            raise BackendError(
                "the process backend runs a command, and the create_runner payload has none"
            )
        executable = spec.command[0]
        if shutil.which(executable) is None:
            raise BackendError(f"cannot run {executable!r}: not found or not executable")
        env = {**self.base_env, **spec.env}
        try:
            # Issue 21 item 13: the pool's env is the runner's alone; the supervisor gets it
            # over the spawner's pipe (never on disk) and runs in the allow-listed basics.
            encode_runner_env(env)  # what no process could hold is refused here
        except ValueError as exc:
            raise BackendError(f"the runner's environment is refused: {exc}") from None
        run_dir = self.run_dir(spec.runner_id)
        with self._lock:
            if (run_dir / META_FILE).exists():
                raise WorkloadExists(f"runner {spec.runner_id} already has a process")
            if run_dir.exists():
                # A create that died before its meta.json: nothing was started from it.
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True, mode=0o700)
            (run_dir / "work").mkdir()
            meta: dict[str, Any] = {
                "runner_id": spec.runner_id,
                "runner_name": spec.runner_name,
                "pool": spec.pool,
                "argv": list(spec.command),
                "started_at": time.time(),
                "pid": None,
                "proc_start_time": None,
            }
            _write_json(run_dir / META_FILE, meta)
            try:
                # Forked by the spawner with the stop signals blocked until it has forked the
                # runner, so a stop right after the create can neither kill it unrecorded
                # nor be lost before the runner exists (process_shim.supervise).
                pid, start_time = self._spawner.spawn(str(run_dir), list(spec.command), env)
            except SpawnRefused as exc:
                if exc.uncertain:
                    # A supervisor the dying spawner forked would run a runner nobody tracks:
                    # found by the output file it writes to, and ended with its runner.
                    time.sleep(ORPHAN_SETTLE)
                    kill_writers_of(run_dir / OUTPUT_FILE, self.proc_root)
                shutil.rmtree(run_dir, ignore_errors=True)
                raise BackendError(f"cannot start the runner's supervisor: {exc}") from exc
            meta["pid"] = pid
            meta["proc_start_time"] = start_time
            _write_json(run_dir / META_FILE, meta)
        return Handle(runner_id=spec.runner_id, ref=str(run_dir))

    def close(self) -> None:
        self._spawner.close()

    def inspect(self, runner_id: int) -> Workload:
        run_dir = self.run_dir(runner_id)
        with self._lock:
            # Under the create's lock, so a half-made runner (meta.json without its pid yet)
            # is never read as one that exited.
            meta = _read_meta(run_dir)
        if meta is None:
            return Workload(runner_id=runner_id, status=WorkloadStatus.MISSING)
        code = _read_exit_code(run_dir)
        if code is None and self._alive(meta):
            status = WorkloadStatus.RUNNING
        else:
            status = WorkloadStatus.EXITED
            # Read again: the shim may have written it between the first read and the check.
            code = _read_exit_code(run_dir) if code is None else code
        return Workload(
            runner_id=runner_id,
            status=status,
            exit_code=code,
            runner_name=meta.get("runner_name"),
            pool=meta.get("pool"),
            started_at=meta.get("started_at"),
            log_ref=str(run_dir / OUTPUT_FILE),
            # Read now: the directory is deleted once the controller has the end report.
            output_tail=read_tail(run_dir / OUTPUT_FILE)
            if status == WorkloadStatus.EXITED
            else None,
        )

    def list(self) -> list[Workload]:
        try:
            entries = sorted(self.runners_dir.iterdir())
        except FileNotFoundError:
            return []
        workloads = []
        for entry in entries:
            if entry.is_dir() and entry.name.isdigit():
                workload = self.inspect(int(entry.name))
                if workload.status != WorkloadStatus.MISSING:
                    workloads.append(workload)
        return workloads

    def stop(self, runner_id: int, timeout: float, grace: float = 0.0) -> None:
        run_dir = self.run_dir(runner_id)
        meta = _read_meta(run_dir)
        if meta is None or not self._alive(meta):
            return
        # RUN-11: first the grace, unsignalled, for a draining runner to finish its job and
        # exit by itself; only then SIGTERM, and SIGKILL after `timeout`.
        if grace > 0 and self._wait_gone(runner_id, meta, grace):
            return
        self._signal_group(meta, signal.SIGTERM)
        if self._wait_gone(runner_id, meta, timeout):
            # The shim has written the runner's exit code; this only covers a shim that died.
            write_exit_code(run_dir, SIGNAL_EXIT_BASE + signal.SIGTERM, only_if_missing=True)
            return
        self._signal_group(meta, signal.SIGKILL)
        self._wait_gone(runner_id, meta, KILL_WAIT)
        # SIGKILL took the shim too, so nobody else will write the file.
        write_exit_code(run_dir, SIGNAL_EXIT_BASE + signal.SIGKILL, only_if_missing=True)

    def remove(self, runner_id: int) -> None:
        run_dir = self.run_dir(runner_id)
        meta = _read_meta(run_dir)
        if meta is not None and self._alive(meta):
            self._signal_group(meta, signal.SIGKILL)
            if not self._wait_gone(runner_id, meta, KILL_WAIT):
                raise BackendError(f"runner {runner_id}'s process did not die after SIGKILL")
        try:
            shutil.rmtree(run_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise BackendError(f"cannot delete {run_dir}: {exc}") from exc

    def logs(self, runner_id: int) -> bytes:
        try:
            return (self.run_dir(runner_id) / OUTPUT_FILE).read_bytes()
        except FileNotFoundError:
            return b""

    def follow_logs(self, runner_id: int) -> LogFollow:
        """The output file from its start, then as it grows, until the runner has exited
        and the file is read to its end (LOG-02). `close` stops it within a poll."""
        path = self.run_dir(runner_id) / OUTPUT_FILE
        stopped = threading.Event()

        def pieces() -> Iterator[bytes]:
            try:
                log = open(path, "rb")  # closed by the `with` below, held across yields
            except FileNotFoundError:
                return
            with log:
                while not stopped.is_set():
                    piece = log.read(FOLLOW_READ)
                    if piece:
                        yield piece
                        continue
                    # At the end of the file: done once the runner has exited, after one
                    # more read for what it wrote between that read and its exit.
                    if self.inspect(runner_id).status != WorkloadStatus.RUNNING:
                        while piece := log.read(FOLLOW_READ):
                            yield piece
                        return
                    stopped.wait(FOLLOW_POLL)

        return LogFollow(pieces(), on_close=stopped.set)

    def probe(self) -> HostSize:
        cpus, memory_mb = local_size(self.cgroup_root, self.proc_root)
        return HostSize(cpus=cpus, memory_mb=memory_mb, platform=platform_name())

    # -- helpers --------------------------------------------------------------------------

    def run_dir(self, runner_id: int) -> Path:
        return self.runners_dir / str(int(runner_id))

    def _alive(self, meta: dict[str, Any]) -> bool:
        """The shim recorded in meta.json is still running; a reused pid does not count."""
        pid = meta.get("pid")
        if not isinstance(pid, int):
            return False
        identity = process_identity(pid, self.proc_root)
        if identity is None:
            return False
        state, started = identity
        if meta.get("proc_start_time") is not None and started != meta["proc_start_time"]:
            return False
        return state not in ("Z", "X", "x")

    def _signal_group(self, meta: dict[str, Any], signum: int) -> None:
        # Only while the shim is alive: its pid is then certainly still our group's id.
        if not self._alive(meta):
            return
        try:
            os.killpg(int(meta["pid"]), signum)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise BackendError(f"cannot signal runner {meta.get('runner_id')}: {exc}") from exc

    def _wait_gone(self, runner_id: int, meta: dict[str, Any], timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if not self._alive(meta):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL)


def read_tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> str | None:
    """The last `limit` bytes of a runner's output as text, None if there is no file.

    Undecodable bytes and NUL become U+FFFD, so the text is always valid in a report.
    """
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - limit))
            data = log.read(limit)
    except OSError:
        return None
    return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def runner_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a runner inherits from the agent's environment: the allow-list, nothing else."""
    return {key: environ[key] for key in INHERITED_ENV if key in environ}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _read_meta(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_exit_code(run_dir: Path) -> int | None:
    try:
        return int((run_dir / EXIT_CODE_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
