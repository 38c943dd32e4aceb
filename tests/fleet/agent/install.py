"""The agent installed as a remote host installs it: the project's wheel in a fresh
virtualenv next to the agent's own dependencies (fleet/agent/requirements.txt) and nothing
else, so neither Django nor any other controller dependency can be imported there.

Offline: the wheel is built from this checkout without build isolation, and the
dependencies are the test environment's own installed distributions, each linked into one
directory the virtualenv reads through a `.pth` file. Only the distributions the agent's
requirements name, and what they in turn require, are linked.
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


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def dependency_closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """Every installed distribution `requirements` need, by normalised name (markers of this
    interpreter; no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    environment = {**default_environment(), "extra": ""}
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name in found:
            continue
        dist = metadata.distribution(requirement.name)
        found[name] = dist
        todo.extend(Requirement(r) for r in dist.requires or [])
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


@dataclass
class AgentInstall:
    venv: Path
    python: Path
    script: Path  # the `zoomies-agent` console script
    distributions: list[str]  # what the agent's dependencies brought, by name


def install_agent_only(dest: Path) -> AgentInstall:
    src, dist_dir, deps, venv = dest / "src", dest / "dist", dest / "deps", dest / "venv"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    run = {"check": True, "capture_output": True, "text": True, "timeout": 300}
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist_dir, src],
        **run,
    )
    (wheel,) = dist_dir.glob("zoomies-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], **run)
    python = venv / "bin" / "python"
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], **run)
    closure = dependency_closure(requirement_lines(AGENT_REQUIREMENTS))
    deps.mkdir()
    for dist in closure.values():
        for top in _top_level(dist):
            link = deps / top.name
            if not link.exists():
                os.symlink(top, link)
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], **run
    ).stdout.strip()
    Path(purelib, "zoomies-agent-deps.pth").write_text(f"{deps}\n")
    return AgentInstall(venv, python, venv / "bin" / "zoomies-agent", sorted(closure))
