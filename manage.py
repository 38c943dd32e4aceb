#!/usr/bin/env python
"""Django's command-line utility for Zoomies."""

import atexit
import os
import shutil
import sys
import tempfile

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoomies_site.settings")
    if sys.argv[1:2] == ["controller"]:
        count_metrics_in_files()
    from django.core.management import execute_from_command_line  # noqa: PLC0415  # once DJANGO_SETTINGS_MODULE is set

    execute_from_command_line(sys.argv)


def count_metrics_in_files() -> None:
    """The controller forks its web server and workers (zoomies_site/core/forked.py), and
    prometheus_client chooses how a process keeps its counts when its first metric is made:
    in files, which the children inherit and /metrics adds up, only if this variable is set
    by then. The controller points it at its data directory's once it holds the lock; until
    then its own counts go to a directory of its own, which it removes once it has pointed
    the variable at its data directory (or at its exit, if it never got that far)."""
    if METRICS_DIR_ENV in os.environ:
        return
    where = tempfile.mkdtemp(prefix="zoomies-controller-metrics-")  # metrics.STARTUP_DIR_PREFIX
    atexit.register(shutil.rmtree, where, True)
    os.environ.update({METRICS_DIR_ENV: where})


if __name__ == "__main__":
    main()
