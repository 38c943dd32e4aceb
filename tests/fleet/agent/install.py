"""The agent installed as a remote host installs it: the project's wheel in a fresh
virtualenv next to the agent's own dependencies (fleet/agent/requirements.txt) and nothing
else, so neither Django nor any other controller dependency can be imported there.

Offline: the wheel is built from this checkout without build isolation, and the
dependencies are the test environment's own installed distributions, each linked into one
directory the virtualenv reads through a `.pth` file. Only the distributions the agent's
requirements name, and what they in turn require, are linked. The controller's wheel test
(tests/zoomies_site/test_install.py) installs the same way with the controller's list.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]
AGENT_REQUIREMENTS = ROOT / "fleet" / "agent" / "requirements.txt"
PACKAGES = ("accounts", "capacity", "fleet", "runners", "zoomies_site")
DATA_FILES = ("templates", "static")  # pyproject.toml's data-files


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def dependency_closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """Every installed distribution `requirements` need, by normalised name (markers of this
    interpreter, with the extras asked for: `psycopg[binary]` brings psycopg-binary)."""
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, str]] = set()
    todo = [(Requirement(r), "") for r in requirements]  # each with the extra that asked for it
    while todo:
        requirement, extra = todo.pop()
        environment = {**default_environment(), "extra": extra}
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        for wanted in ("", *sorted(requirement.extras)):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            dist = found.setdefault(name, metadata.distribution(requirement.name))
            todo.extend((Requirement(r), wanted) for r in dist.requires or [])
    return found


def _top_level(dist: metadata.Distribution) -> set[Path]:
    """The files and folders a distribution put at the top of site-packages."""
    base = Path(str(dist.locate_file("")))
    tops = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if parts and parts[0] != ".." and not parts[0].endswith(".pth"):
            tops.add(base / parts[0])
    return tops


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
RUN = {"check": True, "capture_output": True, "text": True, "timeout": 300}


def build_wheel(dest: Path) -> Path:
    """The project's wheel, built from a copy of what it ships (no tests, no .venv)."""
    src, dist_dir = dest / "src", dest / "dist"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in (*PACKAGES, *DATA_FILES):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist_dir, src],
        **RUN,
    )
    (wheel,) = dist_dir.glob("zoomies-*.whl")
    return wheel


@dataclass
class WheelInstall:
    venv: Path
    python: Path
    distributions: list[str]  # what the requirements brought, by name


def install_wheel(dest: Path, wheel: Path, requirements: list[str]) -> WheelInstall:
    """`wheel` in a fresh virtualenv under `dest`, beside the installed distributions that
    `requirements` need, and nothing else."""
    deps, venv = dest / "deps", dest / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], **RUN)
    python = venv / "bin" / "python"
    subprocess.run([*PIP, "--python", python, "install", "--no-deps", "--no-index", wheel], **RUN)
    closure = dependency_closure(requirements)
    deps.mkdir()
    for dist in closure.values():
        for top in _top_level(dist):
            link = deps / top.name
            if not link.exists():
                os.symlink(top, link)
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], **RUN
    ).stdout.strip()
    Path(purelib, "zoomies-deps.pth").write_text(f"{deps}\n")
    return WheelInstall(venv, python, sorted(closure))


@dataclass
class AgentInstall:
    venv: Path
    python: Path
    script: Path  # the `zoomies-agent` console script
    distributions: list[str]  # what the agent's dependencies brought, by name


def install_agent_only(dest: Path) -> AgentInstall:
    wheel = build_wheel(dest)
    done = install_wheel(dest, wheel, requirement_lines(AGENT_REQUIREMENTS))
    return AgentInstall(
        done.venv, done.python, done.venv / "bin" / "zoomies-agent", done.distributions
    )
