"""docker/compose/: the scale-out shape as a Compose project (issue 26 item 4). No engine here
can pull its PostgreSQL, Redis and nginx images, so it is held to what it names instead: every
Zoomies command and flag exists, every variable is one Zoomies reads, the proxy reaches the
web replicas on the port they bind, and the two keys every process must share are required."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

from fleet.agent import cli as agent_cli
from zoomies_site.core import registry

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose"
# Read by settings.py or the sealing module rather than the registry.
PROCESS_VARIABLES = {"ZOOMIES_DATABASE_URL", "ZOOMIES_REDIS_URL", "ZOOMIES_DJANGO_SECRET",
                     "ZOOMIES_SECRET_KEY", "ZOOMIES_JOIN_TOKEN"}  # fmt: skip


@pytest.fixture(scope="module")
def project() -> dict:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def zoomies_services(project: dict) -> dict[str, dict]:
    return {
        name: s for name, s in project["services"].items() if s.get("entrypoint") == ["zoomies"]
    }


def test_the_shape_is_the_deployment_documents(project):
    services = project["services"]
    assert {"postgres", "redis", "migrate", "web", "workers", "proxy", "agent"} <= set(services)
    assert services["web"]["deploy"]["replicas"] == 2
    assert services["workers"]["deploy"]["replicas"] == 2
    for tier in ("web", "workers"):
        assert services[tier]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully")  # fmt: skip


def test_every_zoomies_command_exists(project):
    commands = get_commands()
    for name, service in zoomies_services(project).items():
        command = service.get("command")
        if command:
            assert command[0] in commands, (name, command)
    web = project["services"]["web"]["command"]
    assert web[:2] == ["web", "--bind"] and re.fullmatch(r"0\.0\.0\.0:\d+", web[2])


def test_every_agent_flag_exists(project):
    parser = argparse.ArgumentParser()
    agent_cli.add_arguments(parser)
    known = {o for action in parser._actions for o in action.option_strings}
    flags = [a for a in project["services"]["agent"]["command"] if a.startswith("--")]
    assert flags and set(flags) <= known, set(flags) - known


def test_every_variable_is_one_zoomies_reads(project):
    env_file = (COMPOSE / "zoomies.env.example").read_text()
    named = set(re.findall(r"^#?\s*(ZOOMIES_[A-Z0-9_]+)=", env_file, flags=re.M))
    for service in zoomies_services(project).values():
        named |= set(service.get("environment", {}))
    readable = {s.env for s in registry.SETTINGS.values()} | PROCESS_VARIABLES
    readable |= {f"{s.env}_FILE" for s in registry.SETTINGS.values()}
    assert named and named <= readable, named - readable
    # The two keys every process must share are asked for, empty until filled in.
    for key in ("ZOOMIES_DJANGO_SECRET", "ZOOMIES_SECRET_KEY"):
        assert re.search(rf"^{key}=$", env_file, flags=re.M), key


def test_the_proxy_reaches_the_web_replicas_on_their_port(project):
    port = project["services"]["web"]["command"][2].rsplit(":", 1)[1]
    conf = (COMPOSE / "nginx.conf").read_text()
    assert f"http://web:{port}" in conf and "proxy_buffering off" in conf
    assert "./nginx.conf:/etc/nginx/conf.d/default.conf:ro" in project["services"]["proxy"][
        "volumes"]  # fmt: skip
