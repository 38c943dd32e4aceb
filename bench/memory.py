"""The controller's idle memory: PSS and RSS of its whole process tree, process by process.

    .venv/bin/python -m bench.memory [--settle 20] [--json PATH]

The controller as the README starts it (`manage.py controller`, embedded agent, SQLite,
through tests/e2e/harness.Controller), left idle `--settle` seconds after it answers, then
every process of its session read from /proc/<pid>/smaps_rollup. PSS (each shared page
divided among the processes that map it) adds up to what the tree costs the machine; RSS
counts shared pages once per process. The floors, in the same run: daphne serving a bare
ASGI app (bench/floor_asgi.py) and a hello-world Django app (bench/floor_django.py), idle.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    flush,
    load_average,
    machine,
    session_memory,
    sigterm_raises,
    stop_controller,
    table,
)
from bench.webhook_ingest import Floor  # noqa: E402
from tests.e2e.harness import Controller  # noqa: E402


def measure(settle: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="zoomies-bench-memory-") as tmp:
        controller = Controller(Path(tmp) / "memory")
        controller.data_dir.mkdir()
        floors = []
        try:
            controller.start()
            floors = [
                Floor(Path(tmp) / "floor.log"),
                Floor(Path(tmp) / "django.log", "bench.floor_django:application"),
            ]
            for floor in floors:
                floor.wait_ready()
            time.sleep(settle)
            processes = session_memory(controller.process.pid)
            floor_pss = []
            for floor in floors:
                memory = session_memory(floor.process.pid)
                floor_pss.append(sum(m[3] for m in memory))
        except BaseException:
            print(f"controller log (tail):\n{controller.log()}", file=sys.stderr)
            raise
        finally:
            for floor in floors:
                floor.stop()
            stop_controller(controller)
    return {
        "processes": [
            {"pid": pid, "role": role, "rss_mb": rss, "pss_mb": pss}
            for pid, role, rss, pss in processes
        ],
        "rss_mb": sum(p[2] for p in processes),
        "pss_mb": sum(p[3] for p in processes),
        "floor_asgi_pss_mb": floor_pss[0],
        "floor_django_pss_mb": floor_pss[1],
        "load": load_average(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", type=float, default=20.0, help="seconds idle before reading")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    sigterm_raises()
    print(f"machine: {machine()}")
    flush()
    figures = measure(args.settle)
    rows = [[p["pid"], p["role"], p["rss_mb"], p["pss_mb"]] for p in figures["processes"]]
    rows.append(["all", "", figures["rss_mb"], figures["pss_mb"]])
    print(table(["pid", "role", "RSS MB", "PSS MB"], rows))
    print(
        f"floors (PSS, idle): bare ASGI under daphne {figures['floor_asgi_pss_mb']:.0f} MB, "
        f"Django hello-world under daphne {figures['floor_django_pss_mb']:.0f} MB"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
