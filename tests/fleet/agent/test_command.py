"""`manage.py agent` and `python -m fleet.agent`: thin wrappers that build the Agent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fleet.agent
from fleet.agent.cli import agent_from_options, build_agent, default_capacity, parse_labels
from fleet.management.commands.agent import Command


def test_the_command_builds_a_process_agent_with_the_join_token_from_the_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOOMIES_JOIN_TOKEN", "zjt_from_env")
    parser = Command().create_parser("manage.py", "agent")
    options = vars(
        parser.parse_args(
            [
                "--controller",
                "http://127.0.0.1:8000/",
                "--state-dir",
                str(tmp_path / "state"),
                "--name",
                "host-a",
                "--capacity",
                "3",
                "--label",
                "zone=a",
            ]
        )
    )
    agent = agent_from_options(options)

    assert agent.controller_url == "http://127.0.0.1:8000"
    assert agent.join_token == "zjt_from_env"
    assert (agent.name, agent.capacity, agent.labels) == ("host-a", 3, {"zone": "a"})
    assert agent.state_dir == tmp_path / "state"
    assert agent.work_dir == tmp_path / "state" / "work"
    assert list(agent.backends) == ["process"]
    assert not (tmp_path / "state" / "agent.json").exists(), "nothing written before joining"


def test_defaults_and_labels(tmp_path):
    agent = build_agent(controller_url="http://c", state_dir=tmp_path, environ={})
    assert agent.join_token is None and agent.capacity >= 1 and agent.name
    assert default_capacity(0.5) == 1 and default_capacity(8.0) == 4
    assert parse_labels(["a=1", "b = two"]) == {"a": "1", "b": "two"}
    with pytest.raises(ValueError):
        parse_labels(["nolabel"])


def test_python_m_fleet_agent_refuses_to_start_without_a_join_token(tmp_path):
    root = Path(fleet.agent.__file__).parent.parent.parent
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.agent",
            "--controller",
            "http://127.0.0.1:9",
            "--state-dir",
            str(tmp_path),
        ],
        cwd=root,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 1
    assert "ZOOMIES_JOIN_TOKEN" in done.stderr
