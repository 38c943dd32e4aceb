"""The `zoomies` command: Django's management commands for Zoomies, as `manage.py` runs them.

One entry point for every way in: `zoomies` (the console script a wheel installs),
`python -m zoomies_site` (what the installed systemd unit runs) and `manage.py` in a
checkout all call `main`. It imports nothing of the project before it has looked at the
command, since the controller's metrics must be counted in files from its first one.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import sys
import tempfile

from zoomies_site.core import environment  # stdlib only: nothing of Django or the metrics

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# zoomies_site.core.metrics.STARTUP_DIR_PREFIX, spelled out: importing that module here would
# make the metrics before METRICS_DIR_ENV is set, which is what this module is for.
STARTUP_DIR_PREFIX = "zoomies-controller-metrics-"
# These commands sign nothing and choose their own data directory: settings would otherwise
# generate a Django key into BASE_DIR/var (inside site-packages, for a wheel) as they load.
KEYLESS_COMMANDS = ("install", "uninstall")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    # A process killed by a fatal signal (SIGSEGV, SIGBUS in a C library) otherwise leaves
    # its log ending mid-line with no word of why: this writes every thread's stack first.
    faulthandler.enable()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
    command = argv[1:2]
    if command == ["controller"]:
        count_metrics_in_files()
    if command and command[0] in KEYLESS_COMMANDS:
        os.environ.setdefault("ZOOMIES_DJANGO_SECRET", "unused-by-install-and-uninstall")
    from django.core.management import execute_from_command_line  # noqa: PLC0415  # once DJANGO_SETTINGS_MODULE is set

    execute_from_command_line(argv)


def count_metrics_in_files() -> None:
    """The controller forks its web server and workers (zoomies_site/core/forked.py), and
    prometheus_client chooses how a process keeps its counts when its first metric is made:
    in files, which the children inherit and /metrics adds up, only if this variable is set
    by then. The controller points it at its data directory's once it holds the lock; until
    then its own counts go to a directory of its own, which it removes once it has pointed
    the variable at its data directory (or at its exit, if it never got that far)."""
    if METRICS_DIR_ENV in os.environ:
        return
    where = tempfile.mkdtemp(prefix=STARTUP_DIR_PREFIX)
    atexit.register(shutil.rmtree, where, True)
    os.environ.update({METRICS_DIR_ENV: where})
    # The controller's own counts (its task cluster's threads count reconcile passes) move to
    # the data directory with the variable: prometheus_client opens its files afresh when the
    # process identifier changes, as after a fork, so it reads negative until the switch.
    from prometheus_client import values  # noqa: PLC0415  # before any metric is made

    values.ValueClass = values.MultiProcessValue(
        lambda: -os.getpid() if environment.read(METRICS_DIR_ENV) == where else os.getpid()
    )
