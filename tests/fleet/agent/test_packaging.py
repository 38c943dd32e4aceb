"""The agent as its own program (issue 7 item 5): one list of its dependencies, pinned as
the controller pins them, and one command, `zoomies-agent` (or `python -m fleet.agent`)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from fleet.agent import cli
from tests.fleet.agent.install import AGENT_REQUIREMENTS, ROOT, requirement_lines


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_agents_dependencies_are_one_list_pinned_as_the_controller_pins_them():
    agent = requirement_lines(AGENT_REQUIREMENTS)
    controller = set(requirement_lines(ROOT / "requirements.txt"))
    assert agent and all("==" in line for line in agent)
    assert set(agent) <= controller, "fleet/agent/requirements.txt pins differ"
    assert pyproject()["project"]["optional-dependencies"]["agent"] == agent
    assert not any(line.lower().startswith(("django", "psycopg")) for line in agent)


def test_the_console_script_is_the_agents_cli():
    target = pyproject()["project"]["scripts"]["zoomies-agent"]
    module, _, function = target.partition(":")
    assert (module, function) == ("fleet.agent.cli", "main")
    assert getattr(cli, function) is cli.main


def test_python_dash_m_fleet_agent_is_the_same_command():
    done = subprocess.run(
        [sys.executable, "-m", "fleet.agent", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: zoomies-agent" in done.stdout and "--ca-file" in done.stdout
