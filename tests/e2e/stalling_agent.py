"""`python -m tests.e2e.stalling_agent`: the real agent (`zoomies-agent`'s options), except
that its process backend's create hangs once it got that far, so a test can kill -9 it with
a create task in flight at a known point (tests/e2e/test_agent_restart.py).

`--stall before` hangs before the workload exists, `--stall after` once it runs; either way
the task's result is never posted. The path in `--mark` gets the runner id when it hangs.
"""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path

from fleet.agent.backends.base import Handle, RunnerSpec
from fleet.agent.backends.process import ProcessBackend
from fleet.agent.cli import add_arguments, agent_from_options


class StallingBackend(ProcessBackend):
    """A process backend whose every create hangs, before or after it made the workload."""

    def __init__(self, work_dir: Path, *, after: bool, mark: Path) -> None:
        super().__init__(work_dir)
        self.after = after
        self.mark = mark

    def create(self, spec: RunnerSpec) -> Handle:
        if self.after:
            super().create(spec)
        # Written whole, then renamed: the test polls for the file and reads it at once.
        partial = self.mark.with_name(self.mark.name + ".partial")
        partial.write_text(str(spec.runner_id))
        partial.rename(self.mark)
        threading.Event().wait()  # until the test kills this process
        raise AssertionError("not reached")


def main() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--stall", choices=("before", "after"), required=True)
    parser.add_argument("--mark", type=Path, required=True)
    options = vars(parser.parse_args())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    agent = agent_from_options(options)
    process = agent.backends["process"]
    assert isinstance(process, ProcessBackend)
    agent.backends["process"] = StallingBackend(
        process.work_dir, after=options["stall"] == "after", mark=options["mark"]
    )
    agent.run()


if __name__ == "__main__":
    main()
