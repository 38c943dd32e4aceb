"""The installer (issue 26 item 1, ARCH-11): `zoomies install` writes the systemd unit, the
environment file and the data directory, collects the static files, checks the
configuration and records what it wrote; `uninstall` removes that and nothing else.

The fast tests install from this checkout into a throwaway root; the wheel test builds the
wheel, installs it in a throwaway virtualenv and runs the controller the way the unit would.
"""

from __future__ import annotations

import configparser
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from io import StringIO
from pathlib import Path

import httpx
import pytest
from django.core.management import CommandError, call_command

from tests.e2e.harness import free_port, kill_leftovers, wait_for
from tests.fleet.agent.install import ROOT, build_wheel, install_wheel
from zoomies_site import cli
from zoomies_site.installer import MANIFEST_NAME, InstallError, Layout, Program, render_unit

DATA_DIR = Path("/var/lib/zoomies")
ENV_FILE = Path("/etc/zoomies/zoomies.env")
UNIT = Path("/etc/systemd/system/zoomies.service")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def parse_unit(text: str) -> configparser.SectionProxy:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read_string(text)
    return unit["Service"]


def inside(root: Path, path: Path) -> Path:
    return root / path.relative_to("/")


def everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def install(root: Path, *args: str) -> str:
    said = StringIO()
    call_command("install", "--root", str(root), *args, stdout=said)
    return said.getvalue()


def uninstall(root: Path, *args: str) -> str:
    said = StringIO()
    call_command("uninstall", "--root", str(root), *args, stdout=said)
    return said.getvalue()


# --- the unit ---------------------------------------------------------------------------


def test_the_unit_runs_this_checkouts_manage_py_with_the_data_dir_and_environment_file():
    """Issue 26 item 1: ExecStart is this interpreter running manage.py of this checkout, the
    unit names the data directory and the environment file, KillMode=mixed, restart on
    failure, and systemd's StateDirectory= for a data directory under /var/lib."""
    service = parse_unit(render_unit(Layout(), Program.this_one()))
    assert service["ExecStart"] == f"{sys.executable} {ROOT / 'manage.py'} controller"
    assert service["ExecStartPre"].startswith(
        f"{sys.executable} {ROOT / 'manage.py'} collectstatic"
    )
    assert service["WorkingDirectory"] == str(ROOT)
    assert service["Environment"] == "ZOOMIES_DATA_DIR=/var/lib/zoomies"
    assert service["EnvironmentFile"] == "-/etc/zoomies/zoomies.env"
    assert (service["KillMode"], service["Restart"]) == ("mixed", "on-failure")
    assert (service["User"], service["StateDirectory"]) == ("zoomies", "zoomies")


def test_an_installed_wheels_unit_runs_python_dash_m_zoomies_site_in_its_data_dir():
    """Issue 26 item 1: from a wheel (no manage.py beside the code) the unit runs the same
    command as `python -m zoomies_site`; a data directory outside /var/lib is no
    StateDirectory= (systemd would make /var/lib/... instead)."""
    wheel = Program(("/opt/venv/bin/python", "-m", "zoomies_site"), None)
    layout = Layout(data_dir=Path("/srv/zoomies"), env_file=Path("/srv/z.env"), user="ci")
    service = parse_unit(render_unit(layout, wheel))
    assert service["ExecStart"] == "/opt/venv/bin/python -m zoomies_site controller"
    assert service["WorkingDirectory"] == "/srv/zoomies"
    assert service["Environment"] == "ZOOMIES_DATA_DIR=/srv/zoomies"
    assert service["EnvironmentFile"] == "-/srv/z.env"
    assert service["User"] == "ci" and "StateDirectory" not in service


@pytest.mark.parametrize("data_dir", ["/var/lib/zoo mies", "/var/lib/50%", "/var/lib/$HOME"])
def test_a_path_a_unit_would_read_as_something_else_is_refused(data_dir):
    """Issue 26 item 1: systemd reads spaces, % and $ in a unit's values; such a path would
    quietly name another directory, so install refuses it."""
    with pytest.raises(InstallError, match="systemd unit would read"):
        render_unit(Layout(data_dir=Path(data_dir)), Program.this_one())


# --- install and uninstall into a throwaway root ----------------------------------------


def test_install_writes_unit_env_file_and_data_dir_and_uninstall_takes_them_back(tmp_path):
    """Issue 26 item 1: install writes the rendered unit, an environment file (the data
    directory and a commented line per important setting), the data directory with the
    collected static files, and a manifest with each file's SHA-256; under --root it skips
    useradd and chown and says so. Uninstall removes all of it but the data directory
    and its data; --purge-data would take that too (the wheel test)."""
    output = install(tmp_path)

    unit = inside(tmp_path, UNIT)
    assert parse_unit(unit.read_text())["ExecStart"].endswith("manage.py controller")
    env_text = inside(tmp_path, ENV_FILE).read_text()
    assert "ZOOMIES_DATA_DIR=/var/lib/zoomies\n" in env_text
    assert "#ZOOMIES_GITHUB_APP_ID=0" in env_text and "#ZOOMIES_SERVER_BIND=" in env_text
    assert inside(tmp_path, ENV_FILE).stat().st_mode & 0o777 == 0o640
    data = inside(tmp_path, DATA_DIR)
    assert data.stat().st_mode & 0o777 == 0o750
    assert (data / "static" / "dashboard" / "dashboard.css").is_file()
    assert (data / "static" / "admin" / "css" / "base.css").is_file()

    manifest = json.loads((data / MANIFEST_NAME).read_text())
    assert manifest["files"][str(UNIT)] == hashlib.sha256(unit.read_bytes()).hexdigest()
    assert str(ENV_FILE) in manifest["files"]
    assert str(DATA_DIR / "static/dashboard/live.js") in manifest["files"]
    assert manifest["data_dir_created"] is True and manifest["user_created"] is False
    assert any(step.startswith("useradd --system") for step in manifest["skipped"])
    assert "Skipped (not the real system's root, or not root): useradd" in output
    assert "The configuration checks pass." in output
    assert "systemctl daemon-reload && systemctl enable --now zoomies" in output
    assert "create_admin" in output

    data_files = {path.name for path in data.iterdir()} - {"static", MANIFEST_NAME}
    uninstall(tmp_path)
    left = everything_under(tmp_path)
    # What the data directory held besides what install collected: its data, kept.
    kept = {"var", "var/lib", "var/lib/zoomies"} | {
        f"var/lib/zoomies/{name}" for name in data_files
    }
    assert left == kept and "django-secret" in data_files


def test_an_operators_files_are_neither_overwritten_nor_removed(tmp_path):
    """Issue 26 item 1: an environment file already there is kept as it is (and its values
    are what the checks see); a file install wrote but the operator changed since is left
    by uninstall and named; so is a file of theirs in a directory install made."""
    env_file = inside(tmp_path, ENV_FILE)
    env_file.parent.mkdir(parents=True)
    env_file.write_text("ZOOMIES_LOG_LEVEL=DEBUG\n")
    output = install(tmp_path)
    assert env_file.read_text() == "ZOOMIES_LOG_LEVEL=DEBUG\n"
    assert f"Kept {ENV_FILE}" in output

    unit = inside(tmp_path, UNIT)
    unit.write_text(unit.read_text().replace("RestartSec=5", "RestartSec=9"))
    theirs = inside(tmp_path, UNIT.parent / "other.service")
    theirs.write_text("[Unit]\n")

    said = uninstall(tmp_path, "--purge-data")
    assert f"Left {UNIT}: it changed since install wrote it." in said
    assert unit.exists() and theirs.exists() and env_file.exists()
    assert not inside(tmp_path, DATA_DIR).exists()


def test_install_refuses_a_unit_it_did_not_write(tmp_path):
    """Issue 26 item 1: a zoomies.service that is not the one install wrote (another
    install's, the operator's) is not overwritten."""
    unit = inside(tmp_path, UNIT)
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    with pytest.raises(CommandError, match="is not the unit install wrote"):
        install(tmp_path)
    assert unit.read_text() == "[Service]\nExecStart=/bin/true\n"
    assert not inside(tmp_path, DATA_DIR).exists()


def test_install_checks_the_configuration_in_the_units_environment(tmp_path):
    """Issue 26 item 1: the checks run as the controller's start runs them, with the unit's
    environment file: an error there fails the install (after recording what it wrote,
    so uninstall still takes it back)."""
    env_file = inside(tmp_path, ENV_FILE)
    env_file.parent.mkdir(parents=True)
    env_file.write_text("# the operator's\nZOOMIES_SERVER_BIND=not-an-address\n")
    with pytest.raises(CommandError, match="configuration checks failed"):
        install(tmp_path)
    assert (inside(tmp_path, DATA_DIR) / MANIFEST_NAME).is_file()
    uninstall(tmp_path, "--purge-data")
    assert everything_under(tmp_path) == {"etc", "etc/zoomies", "etc/zoomies/zoomies.env"}


def test_a_dry_run_writes_nothing(tmp_path):
    """Issue 26 item 1: --dry-run prints the unit and the environment file and writes none."""
    output = install(tmp_path, "--dry-run", "--data-dir", "/srv/zoomies")
    assert "ExecStart=" in output and "ZOOMIES_DATA_DIR=/srv/zoomies" in output
    assert list(tmp_path.iterdir()) == []


# --- packaging --------------------------------------------------------------------------


def test_every_template_and_static_file_is_a_wheel_data_file():
    """Issue 26 item 1: templates/ and static/ reach a wheel install through pyproject's
    data-files (share/zoomies/...), which list one directory each: a file none lists would
    be missing from every installed controller."""
    listed = set()
    for dest, patterns in pyproject()["tool"]["setuptools"]["data-files"].items():
        for pattern in patterns:
            for found in glob.glob(str(ROOT / pattern)):
                listed.add(f"{dest}/{Path(found).name}")
    shipped = {
        f"share/zoomies/{path.relative_to(ROOT)}"
        for top in ("templates", "static")
        for path in (ROOT / top).rglob("*")
        if path.is_file() and path.name != "README.md"
    }
    assert listed == shipped


def test_the_controller_extra_is_the_runtime_half_of_requirements_txt():
    """Issue 26 item 1: `pip install "zoomies[controller]"` installs what a checkout runs
    on, with the same pins; the plain dependencies stay empty, so the agent-only install
    brings no Django."""
    runtime = (ROOT / "requirements.txt").read_text().split("# Tests and tooling.")[0]
    lines = [line.split("#", 1)[0].strip() for line in runtime.splitlines()]
    project = pyproject()["project"]
    assert project["optional-dependencies"]["controller"] == [line for line in lines if line]
    assert project["dependencies"] == []


def test_the_zoomies_command_is_manage_py_and_counts_the_controllers_metrics_in_files(
    monkeypatch,
):
    """Issue 26 item 1: the `zoomies` console script is zoomies_site.cli:main, which manage.py
    and `python -m zoomies_site` call, and for `controller` it still points
    PROMETHEUS_MULTIPROC_DIR at a directory before anything makes a metric."""
    assert pyproject()["project"]["scripts"]["zoomies"] == "zoomies_site.cli:main"
    assert "from zoomies_site.cli import main" in (ROOT / "manage.py").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "zoomies_site", "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "'zoomies help <subcommand>'" in done.stdout
    assert "install" in done.stdout and "uninstall" in done.stdout
    ran: list[tuple[list[str], str | None]] = []
    monkeypatch.setattr(
        "django.core.management.execute_from_command_line",
        lambda argv: ran.append((argv, os.environ.get(cli.METRICS_DIR_ENV))),
    )
    # Set, then unset: monkeypatch then puts back the process's own state, whatever main did.
    monkeypatch.setenv(cli.METRICS_DIR_ENV, "")
    monkeypatch.delenv(cli.METRICS_DIR_ENV)
    cli.main(["zoomies", "help"])
    cli.main(["zoomies", "controller", "--no-agent"])
    (help_argv, help_dir), (controller_argv, metrics_dir) = ran
    assert help_dir is None and controller_argv == ["zoomies", "controller", "--no-agent"]
    assert Path(metrics_dir).name.startswith(cli.STARTUP_DIR_PREFIX)
    assert Path(metrics_dir).is_dir()
    shutil.rmtree(metrics_dir)


# --- the wheel, installed and run as the unit would run it ------------------------------


def unit_environment(root: Path, service: configparser.SectionProxy) -> dict[str, str]:
    """What systemd would give ExecStart: Environment=, then EnvironmentFile= (its values
    win), with the installed system's data directory found under the throwaway root."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ZOOMIES_", "DJANGO_", "PROMETHEUS_", "PYTHON"))
    }
    name, _, value = service["Environment"].partition("=")
    env[name] = value
    for line in inside(root, Path(service["EnvironmentFile"].lstrip("-"))).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    env["ZOOMIES_DATA_DIR"] = str(inside(root, Path(env["ZOOMIES_DATA_DIR"])))
    return env


@pytest.mark.e2e
@pytest.mark.any_database  # its own SQLite file, whichever engine the pass is for
@pytest.mark.slow  # about 35 s of a worker: .ci/run's slow pass, after the test command
def test_the_wheel_installs_runs_as_its_unit_says_and_uninstalls_without_a_trace(tmp_path):
    """Issue 26 acceptance, item 1 (ARCH-11): the built wheel in a fresh virtualenv with the
    controller's dependencies only, `zoomies install` into a throwaway root, the controller
    started with the unit's ExecStartPre and ExecStart, Environment= and EnvironmentFile=
    (no systemd here): /healthz answers 200, the admin's sign-in page renders the
    dashboard's templates (installed under share/zoomies) and the static files are served;
    SIGTERM stops it; `zoomies uninstall --purge-data` leaves the root empty."""
    controller = pyproject()["project"]["optional-dependencies"]["controller"]
    wheel = build_wheel(tmp_path / "build")
    venv = install_wheel(tmp_path / "host", wheel, controller)
    zoomies = venv.venv / "bin" / "zoomies"
    root = tmp_path / "root"
    root.mkdir()
    run = {"capture_output": True, "text": True, "timeout": 300, "cwd": "/"}

    done = subprocess.run([zoomies, "install", "--root", root], **run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "The configuration checks pass." in done.stdout
    service = parse_unit(inside(root, UNIT).read_text())
    start = service["ExecStart"].split()
    assert start == [str(venv.python), "-m", "zoomies_site", "controller"]
    env = unit_environment(root, service)
    cwd = inside(root, Path(service["WorkingDirectory"]))
    pre = subprocess.run(service["ExecStartPre"].split(), env=env, **{**run, "cwd": cwd})
    assert pre.returncode == 0, pre.stderr

    port = free_port()
    log = (tmp_path / "controller.log").open("w")
    child = subprocess.Popen(
        [*start, "--bind", f"127.0.0.1:{port}", "--no-agent"],
        env=env,
        cwd=cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert child.poll() is None, (tmp_path / "controller.log").read_text()
            return httpx.get(f"{base}/healthz", timeout=5).status_code == 200

        wait_for(healthy, 120, "the installed controller's /healthz")
        assert httpx.get(f"{base}/admin/login/", timeout=10).status_code == 200
        css = httpx.get(f"{base}/static/dashboard/dashboard.css", timeout=10)
        assert (
            css.status_code == 200
            and css.content == (ROOT / "static/dashboard/dashboard.css").read_bytes()
        )
        child.send_signal(signal.SIGTERM)  # KillMode=mixed: the controller alone
        assert child.wait(timeout=60) == 0, (tmp_path / "controller.log").read_text()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        log.close()
        kill_leftovers(str(root))

    done = subprocess.run([zoomies, "uninstall", "--root", root, "--purge-data"], **run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(root.iterdir()) == []
    # Nor did install leave a Django key where settings default the data directory to.
    (site_packages,) = venv.venv.glob("lib/python*/site-packages")
    assert not (site_packages / "var").exists()
