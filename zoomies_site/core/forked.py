"""Children forked from the controller: the web server and the django-q2 cluster.

The controller has imported the project and set Django up before it starts them, so a fork
gives each child that for free: a child started as a fresh interpreter imported it all again
(about 1.5 s of CPU each here), and its pages were its own where a fork shares the parent's
until either writes them (the idle footprint, docs/performance.md "Memory").

What a fork carries over that an exec did not, and how each is handled:

- the database connections: the forking thread's are closed before the fork, so no two
  processes speak on one socket or share SQLite's per-process file state (no other thread
  of the controller has used the database by then);
- the controller's signal handlers: reset to the defaults, then the child installs its own
  (daphne's reactor, django-q2's cluster);
- open files: `close_in_child` names the ones a child must not keep (the controller's file
  lock, which would otherwise stay held until the last child exited);
- Prometheus: the children count into files only if the controller was in multiprocess mode
  before its first metric existed (manage.py sees to that for `controller`); `fork` refuses
  otherwise rather than start children whose counts /metrics would never see;
- atexit handlers and buffered output: the child flushes and leaves with `os._exit`.

A fork copies only the thread that calls it, and a lock another thread held at that moment
stays held in the child. Without `--sandbox` the controller forks before it starts any
thread of its own (the embedded agent and the lease renewal come after). With it, the
sandbox's fake GitHub is already serving on its threads, but idle: nothing has called it
yet (the children are what will), so none of them holds a lock then. The children inherit
its listening socket, which closes with them.

Every process of a child's tree dies with its parent, however the parent dies (issue 21
item 1): the kernel's parent-death signal is SIGKILL, set first thing in the child and again
in every process the child forks in turn (django-q2's sentinel, workers, monitor and pusher
are forks of forks, and the signal is not inherited across a fork), each checking that its
parent did not die before the signal was armed. SIGKILL, because a parent that died was not
there to stop its child in order, and django-q2 ignores or mishandles a SIGTERM that arrives
while its cluster is starting (one start in three kept the whole tree alive as orphans).

Each child leads a process group of its own (issue 21 item 2), so Ctrl-C in a terminal or a
signal to the controller's group reaches only the controller, which stops the children in
its order: the agent, the workers, then the web server. systemd signals every process of a
unit unless told otherwise, hence `KillMode=mixed` in the shipped unit.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable

from django.db import connections

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15  # the name ps, top and /proc/<pid>/comm show: 15 bytes at most
WAIT_POLL = 0.05


class MetricsNotShared(RuntimeError):
    """Prometheus was not in multiprocess mode when this process made its first metric."""


# Loaded once, in the parent: a child arms its parent-death signal before anything else.
_LIBC = ctypes.CDLL(None, use_errno=True)
# The pid of the process that is forking now, written in the parent just before each fork
# by the hook `tie_forks_to_parent` registers, read in the new child.
_forking_parent = 0


def _prctl(option: int, value: object) -> None:
    _LIBC.prctl(option, value)


def arm_parent_death_signal() -> None:
    """The kernel kills this process when its parent dies, however it dies."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with_parent(parent: int) -> None:
    """The kernel kills this process when its parent dies, however it dies (SIGKILL
    included), so no web server or worker outlives its controller. A parent that died
    before the signal was armed left this process to init: then it leaves at once."""
    arm_parent_death_signal()
    if os.getppid() != parent:
        os._exit(1)


def _remember_forking_parent() -> None:
    global _forking_parent  # the at-fork hook's only channel to the child
    _forking_parent = os.getpid()


def _tie_new_child() -> None:
    die_with_parent(_forking_parent)


def tie_forks_to_parent() -> None:
    """Every process this one forks from now on, and their forks in turn (the hooks are
    inherited), dies with its own parent. `subprocess` runs no fork hooks, so a program
    this tree starts on purpose (none does today) is not tied."""
    os.register_at_fork(before=_remember_forking_parent, after_in_child=_tie_new_child)


def set_process_name(name: str) -> None:
    """A fork keeps its parent's command line, so `ps` and `top` would show every child as
    `manage.py controller`; the kernel's name for it (inherited by its own forks, such as
    django-q2's sentinel and workers) says which it is."""
    _prctl(PR_SET_NAME, name.encode()[:15])


def metrics_shared() -> bool:
    from prometheus_client import values  # noqa: PLC0415  # read at call time, not import

    return bool(getattr(values.ValueClass, "_multiprocess", False))


class ForkedChild:
    """A forked child running `run()`, with the part of `subprocess.Popen` the controller
    uses: `args`, `pid`, `returncode`, `poll`, `wait`, `terminate`, `kill`. `process_name`
    is what the kernel calls the child (`set_process_name`)."""

    def __init__(
        self,
        name: str,
        run: Callable[[], object],
        close_in_child: Iterable[int] = (),
        process_name: str = "",
    ):
        if not metrics_shared():
            raise MetricsNotShared(
                f"cannot fork the {name}: Prometheus is not in multiprocess mode in this "
                "process, so the child's counts would never reach /metrics (start it with "
                "`manage.py controller`, which sets PROMETHEUS_MULTIPROC_DIR first)"
            )
        self.args = [name]
        self.returncode: int | None = None
        connections.close_all()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        # Out of the collector's sight before the fork: its passes write into every object
        # they visit, and in a child each such write copies a page the parent shares with it
        # (the idle tree 186 -> 163 MB PSS, docs/performance.md "Memory"). Collected first,
        # so no garbage is kept for ever; the parent's later objects are collected as usual.
        gc.collect()
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the child: _child ends in os._exit, it never returns here
            _child(run, parent, tuple(close_in_child), process_name)
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: as subprocess.Popen says, 0
                self.returncode = 0
                return 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(WAIT_POLL)
        return code

    def send_signal(self, signum: int) -> None:
        # Only a child not yet reaped: a reaped pid may already be someone else's.
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _child(run: Callable[[], object], parent: int, close: tuple[int, ...], name: str) -> None:
    code = 1
    try:
        die_with_parent(parent)
        tie_forks_to_parent()
        os.setpgid(0, 0)  # a signal to the controller's group is the controller's alone
        if name:
            set_process_name(name)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        run()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:  # whatever it was, say it and leave with 1
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
