"""The programs a process-backend runner may run, by the name a pool gives as its image.

A process runner runs on the host as the agent's user, so a pool never names a path or a
command: it names one of these, and the program says how it is started. Two exist: GitHub's
actions runner unpacked on the host (`actions-runner`), and this codebase's fake runner
(`zoomies/fake-runner`, `runners.github.fake.runner`), which the sandbox, the tests and the
benchmarks run against the fake GitHub. What differs between them (the argv, and the fake's
need to import this codebase) is a property of the program here, so the reconcile pass and
the pool validation treat every process image alike.

Pure: no I/O, no Django. The caller passes the settings a program's command needs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from runners.naming import PROCESS_RUNNER

ACTIONS_RUNNER = PROCESS_RUNNER
FAKE_RUNNER = "zoomies/fake-runner"


@dataclass(frozen=True)
class ProcessProgram:
    """One program a process runner may run.

    `command(runner_dir)` is its argv (`runner_dir`: the setting `runners.actions_runner_dir`);
    `environment(code_dir)` is what it adds to the runner's environment (`code_dir`: where
    this codebase lives, for a program that imports it).
    """

    image: str
    command: Callable[[str], list[str]]
    environment: Callable[[str], dict[str, str]] = field(default=lambda code_dir: {})


PROGRAMS: dict[str, ProcessProgram] = {
    program.image: program
    for program in (
        ProcessProgram(ACTIONS_RUNNER, lambda runner_dir: [os.path.join(runner_dir, "run.sh")]),
        # The fake runner is a module of this codebase: the host agent runs it from here.
        ProcessProgram(
            FAKE_RUNNER,
            lambda runner_dir: [sys.executable, "-m", "runners.github.fake.runner"],
            lambda code_dir: {"PYTHONPATH": code_dir},
        ),
    )
}
PROCESS_IMAGES = tuple(PROGRAMS)


def process_program(image: str) -> ProcessProgram:
    """The program a process pool's image names; ValueError for anything else."""
    program = PROGRAMS.get(image)
    if program is None:
        raise ValueError(
            f"the process backend runs only {' or '.join(PROCESS_IMAGES)}, not {image!r}"
        )
    return program
