"""The process programs: how each process image is run is a property of the program, so no
production path special-cases the fake runner (issue 7 item 7)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runners.github.programs import (
    ACTIONS_RUNNER,
    FAKE_RUNNER,
    PROCESS_IMAGES,
    process_program,
)

REPO = Path(__file__).resolve().parents[3]


def test_each_process_image_names_a_program_with_its_command_and_environment():
    actions = process_program(ACTIONS_RUNNER)
    assert actions.command("/opt/runner") == ["/opt/runner/run.sh"]
    assert actions.environment("/code") == {}
    fake = process_program(FAKE_RUNNER)
    assert fake.command("/opt/runner") == [sys.executable, "-m", "runners.github.fake.runner"]
    assert fake.environment("/code") == {"PYTHONPATH": "/code"}
    assert set(PROCESS_IMAGES) == {ACTIONS_RUNNER, FAKE_RUNNER}


@pytest.mark.parametrize("image", ["/bin/sh", "", "actions-runner/../x", "zoomies/fake-runner "])
def test_anything_else_is_no_program(image):
    with pytest.raises(ValueError, match="runs only"):
        process_program(image)


def test_no_production_module_outside_the_github_package_names_the_fake_runner():
    """The test double lives behind runners.github (programs, fake); the reconcile pass, the
    API, the models and the rest treat every process image alike."""
    allowed = {"runners/management/commands/fake_github.py"}
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "runners").rglob("*.py")
        if "github" not in path.relative_to(REPO / "runners").parts[:1]
        and str(path.relative_to(REPO)) not in allowed
        and any(word in path.read_text() for word in ("fake-runner", "github.fake"))
    ]
    assert offenders == []
