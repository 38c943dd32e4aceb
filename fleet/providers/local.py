"""A provider whose "machine" is a fresh agent process on this host (issue 23 item 6).

It exists so the whole path of renting a host runs here, on one box, with nothing faked
past the provider: a queued job on an empty fleet, a machine planned, created, its agent
joining with the single-use claim code, a runner, the job done, the machine idle, drained
and deleted. Each machine is a directory under `root` (its mark, its agent's state and
work, its log) and an agent process in a session of its own, which its delete kills along
with every runner process it started (their command lines name the directory).

Ownership is the `mark` file the create writes: a directory without it, or with another
controller's, is not ours (MACH-16).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleet.agent.backends.process import process_identity
from fleet.agent.state import STATE_FILE
from fleet.providers.contract import (
    IDENTITY,
    MachineSpec,
    Mark,
    NotFound,
    Observed,
    Power,
    Refused,
)

# What the agent process inherits from this one: the basics, and nothing of the controller's
# own configuration (ZOOMIES_*, the database, the secret key).
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME")
STOP_WAIT = 10.0
# How long a create waits for the agent process to be up before it answers.
BOOT_WAIT = 15.0
USER_DATA = "user-data"  # the claim code, 0600, as a VM's cloud-init user data holds it


class LocalProvider:
    def __init__(
        self,
        name: str,
        *,
        root: Path,
        capacity: int = 2,
        backend: str = "process",
        python: str = sys.executable,
    ) -> None:
        self.name = name
        self.root = Path(root)
        self.capacity = capacity
        self.backend = backend
        self.python = python

    # -- the contract --------------------------------------------------------------------

    def create(self, spec: MachineSpec) -> Observed:
        where = self._dir(spec.identity)
        self.root.mkdir(parents=True, exist_ok=True)
        if where.exists():
            raise Refused(f"{spec.identity} exists already")
        # Made whole beside it, then renamed into place: a create cut short (a killed
        # controller) leaves either no machine or one with its mark, its controller's URL and
        # its user data (the claim code, 0600, as a hypervisor keeps a VM's cloud-init), which
        # `start` boots it with.
        staging = self._staging(spec.identity)
        shutil.rmtree(staging, ignore_errors=True)  # a create of this identity cut short
        staging.mkdir(mode=0o700)
        claim_code = spec.bootstrap.get("claim_code", "")
        fd = os.open(staging / USER_DATA, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as user_data:
            user_data.write(claim_code)
        (staging / "controller-url").write_text(spec.bootstrap.get("controller_url", ""))
        (staging / "mark").write_text(spec.mark.controller)
        try:
            os.rename(staging, where)  # fails if `where` appeared meanwhile (not empty)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            raise Refused(f"{spec.identity} exists already") from None
        self._spawn(where, spec.identity, claim_code=claim_code)
        # Like a hypervisor's create, it returns once the machine is up: the agent has
        # started and made its directories (or has already ended, which inspect says).
        deadline = time.monotonic() + BOOT_WAIT
        while not (where / "agent").is_dir() and self._running(where):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        observed = self.inspect(spec.identity)
        if observed is None:  # removed under us between the two lines: say so plainly
            raise Refused(f"{spec.identity} vanished while it was created")
        return observed

    def inspect(self, identity: str) -> Observed | None:
        where = self._dir(identity)
        if not where.is_dir():
            return None
        return Observed(
            identity=identity,
            power=Power.RUNNING if self._running(where) else Power.STOPPED,
            mark=_read_mark(where),
            address="127.0.0.1",
        )

    def list(self) -> list[Observed]:
        if not self.root.is_dir():
            return []
        found = []
        for where in sorted(self.root.iterdir()):
            if where.is_dir() and IDENTITY.match(where.name):
                observed = self.inspect(where.name)
                if observed is not None:
                    found.append(observed)
        return found

    def start(self, identity: str) -> None:
        where = self._existing(identity)
        if not self._running(where):
            # An agent that joined kept its credentials in its state directory: no claim
            # code again. One that never did (its create was cut short) joins with the
            # machine's user data, as a VM's first boot would.
            joined = (where / "agent" / STATE_FILE).exists()
            self._spawn(where, identity, claim_code="" if joined else _read_user_data(where))

    def stop(self, identity: str) -> None:
        where = self._existing(identity)
        self._signal_agent(where, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        while self._running(where) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._signal_agent(where, signal.SIGKILL)

    def delete(self, identity: str) -> None:
        where = self._existing(identity)
        self._signal_agent(where, signal.SIGKILL)
        _kill_named(str(where))  # the runners the agent started, each in a session of its own
        shutil.rmtree(where, ignore_errors=True)
        shutil.rmtree(self._staging(identity), ignore_errors=True)

    # -- the agent process -----------------------------------------------------------------

    def _dir(self, identity: str) -> Path:
        if not IDENTITY.match(identity):
            raise Refused(f"not an identity: {identity!r}")
        return self.root / identity

    def _staging(self, identity: str) -> Path:
        """Where a create writes the machine's files before renaming them into place."""
        return self.root / f".{self._dir(identity).name}.creating"

    def _existing(self, identity: str) -> Path:
        where = self._dir(identity)
        if not where.is_dir():
            raise NotFound(f"no machine {identity}")
        return where

    def _spawn(self, where: Path, identity: str, *, claim_code: str) -> None:
        # The process basics, as the process backend passes them to a runner: no setting.
        env = {k: v for k, v in os.environ.items() if k in INHERITED_ENV}
        if claim_code:
            env["ZOOMIES_CLAIM_CODE"] = claim_code  # by environment: never on a command line
        command = [
            self.python, "-m", "fleet.agent",
            "--controller", (where / "controller-url").read_text(),
            "--name", identity,
            "--state-dir", str(where / "agent"),
            "--capacity", str(self.capacity),
            "--backend", self.backend,
        ]  # fmt: skip
        with open(where / "agent.log", "ab") as log:
            child = subprocess.Popen(
                command,
                cwd=Path(__file__).resolve().parents[2],  # where `fleet` is importable
                env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        identity_of = process_identity(child.pid)
        started = identity_of[1] if identity_of else 0
        (where / "pid").write_text(f"{child.pid} {started}\n")
        _forget(child)

    def _agent(self, where: Path) -> tuple[int, int] | None:
        try:
            pid, started = (where / "pid").read_text().split()
            return int(pid), int(started)
        except (OSError, ValueError):
            return None

    def _running(self, where: Path) -> bool:
        agent = self._agent(where)
        if agent is None:
            return False
        found = process_identity(agent[0])
        # The same process, not a later one under a reused pid, and not a zombie.
        return found is not None and found[1] == agent[1] and found[0] not in ("Z", "X")

    def _signal_agent(self, where: Path, signum: int) -> None:
        agent = self._agent(where)
        if agent is not None and self._running(where):
            try:
                os.killpg(agent[0], signum)
            except ProcessLookupError:
                pass


def _read_user_data(where: Path) -> str:
    try:
        return (where / USER_DATA).read_text().strip()
    except OSError:
        return ""


def _read_mark(where: Path) -> Mark | None:
    try:
        return Mark(where.joinpath("mark").read_text().strip())
    except (OSError, ValueError):
        return None


def _kill_named(needle: str) -> None:
    """SIGKILL every process whose command line names `needle`, with its process group."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            pid = int(entry.name)
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


_children: list[subprocess.Popen] = []


def _forget(child: subprocess.Popen) -> None:
    """Keep the Popen so the agent can be reaped when it ends (no zombie under a worker),
    and reap the ones that have."""
    _children.append(child)
    for done in [c for c in _children if c.poll() is not None]:
        _children.remove(done)
