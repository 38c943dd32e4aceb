"""`zoomies install` and `zoomies uninstall` (issue 26 item 1, ARCH-11): the controller as a
systemd service, from a wheel or from a checkout.

`install` renders the unit (zoomies_site/deploy/zoomies.service) for the interpreter that
runs it, writes the environment file unless one is there, makes the data directory (owned by
the service user, made with useradd if missing), collects the static files into it, runs the
configuration checks the controller runs at start, and prints what is left to do. Every file
and directory it made is recorded with the file's SHA-256 in the data directory's
install-manifest.json, and `uninstall` removes those and nothing else: a file changed since
is left and named, and the data directory stays unless --purge-data.

With --root every path is taken inside that directory (as a package build's DESTDIR): the
unit names the installed system's paths, this process reaches them under the root, and
what only the real system can do (useradd, chown) is recorded as skipped instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from zoomies_site.core import registry

TEMPLATE = Path(__file__).resolve().parent / "deploy" / "zoomies.service"
MANIFEST_NAME = "install-manifest.json"
MANIFEST_FORMAT = 1
# settings.STATIC_ROOT is DATA_DIR / "static": where collectstatic writes.
STATIC_SUBDIR = "static"
# What a child of the unit must not inherit from this process: the unit's environment is the
# Environment= line and the environment file, nothing of whoever ran install.
INHERITED_NOT = ("ZOOMIES_", "DJANGO_", "PROMETHEUS_")
CHILD_TIMEOUT = 300
# systemd reads %, $, quotes, backslashes and spaces in a unit's values; no path of ours needs them.
UNSAFE_IN_UNIT = re.compile(r"[\s%$\"'\\;]")

# The settings an operator sets first, each written into a new environment file as a comment
# with its help and default. Process-level variables (not registry entries) carry their own.
ENV_FILE_SETTINGS = (
    "server.bind",
    "server.tls_cert",
    "server.tls_key",
    "server.tls_proxy",
    "github.app_id",
    "github.private_key_file",
    "github.webhook_secret",
)
PROCESS_VARIABLES = (
    ("ZOOMIES_ALLOWED_HOSTS", "*", "The host names the web server answers to, comma separated."),
    (
        "ZOOMIES_DATABASE_URL",
        "",
        "postgres://user:password@host/db for PostgreSQL; empty for SQLite in the data directory.",
    ),
    ("ZOOMIES_REDIS_URL", "", "Redis for the queue and events when several machines share one."),
    (
        "ZOOMIES_SECRET_KEY_FILE",
        "",
        "The key that seals secrets at rest; empty to generate DATA_DIR/secret-key (back it up).",
    ),
    ("ZOOMIES_CONFIG", "", "A zoomies.yaml with any setting of the Settings page."),
    ("ZOOMIES_LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR."),
)


class InstallError(Exception):
    """Install or uninstall cannot go on; the message says why and what to do."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Layout:
    """Where an install puts things, as the installed system sees them (absolute paths inside
    `root`), and the service user."""

    root: Path = Path("/")
    data_dir: Path = Path("/var/lib/zoomies")
    env_file: Path = Path("/etc/zoomies/zoomies.env")
    unit_dir: Path = Path("/etc/systemd/system")
    user: str = "zoomies"
    unit_name: str = "zoomies.service"

    def __post_init__(self) -> None:
        for name in ("root", "data_dir", "env_file", "unit_dir"):
            path = getattr(self, name)
            if not path.is_absolute():
                raise InstallError(f"--{name.replace('_', '-')} must be an absolute path: {path}")

    def host(self, path: Path) -> Path:
        """`path` of the installed system, as this process reaches it."""
        return self.root / path.relative_to("/")

    @property
    def unit_file(self) -> Path:
        return self.unit_dir / self.unit_name

    @property
    def manifest(self) -> Path:
        return self.data_dir / MANIFEST_NAME

    @property
    def real_root(self) -> bool:
        return self.root == Path("/")

    @property
    def acts_as_root(self) -> bool:
        """Only root on the real system may add users and give files away; elsewhere (a
        --root tree, a test, a packager) those steps are recorded as skipped."""
        return self.real_root and os.geteuid() == 0


@dataclass(frozen=True)
class Program:
    """What the unit runs: this interpreter with `python -m zoomies_site` (a wheel), or with
    this checkout's manage.py; both are the `zoomies` command (zoomies_site/cli.py)."""

    argv: tuple[str, ...]
    checkout: Path | None  # the working directory of a checkout; a wheel's is the data dir

    @classmethod
    def this_one(cls) -> Program:
        top = Path(__file__).resolve().parents[1]
        # sys.executable unresolved: a virtualenv's python is a link that must stay one.
        if (top / "manage.py").is_file():
            return cls((sys.executable, str(top / "manage.py")), top)
        return cls((sys.executable, "-m", "zoomies_site"), None)

    def working_directory(self, layout: Layout) -> Path:
        return self.checkout or layout.data_dir


def _unit_safe(value: str, what: str) -> str:
    if UNSAFE_IN_UNIT.search(value):
        raise InstallError(
            f"{what} {value!r} has a character a systemd unit would read: use another"
        )
    return value


def render_unit(layout: Layout, program: Program) -> str:
    """The unit file's text: the template with its @NAME@ fields filled in."""
    data_dir = layout.data_dir
    if data_dir.is_relative_to("/var/lib") and data_dir != Path("/var/lib"):
        # systemd makes it again (and gives it back to User=) at every start if it went.
        state = f"StateDirectory={data_dir.relative_to('/var/lib')}\nStateDirectoryMode=0750"
    else:
        state = "# Outside /var/lib, so not a StateDirectory=: install made it."
    fields = {
        "USER": _unit_safe(layout.user, "the user"),
        "STATE_DIRECTORY": state,
        "DATA_DIR": _unit_safe(str(data_dir), "the data directory"),
        "ENV_FILE": _unit_safe(str(layout.env_file), "the environment file"),
        "WORKING_DIRECTORY": _unit_safe(
            str(program.working_directory(layout)), "the working directory"
        ),
        "PROGRAM": " ".join(_unit_safe(part, "the program") for part in program.argv),
    }
    text = TEMPLATE.read_text()
    for name, value in fields.items():
        text = text.replace(f"@{name}@", value)
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise InstallError(f"the unit template has fields install does not fill: {left}")
    return text


def env_file_text(layout: Layout) -> str:
    """A new environment file: the data directory, and each important setting commented out
    with its help and default."""
    lines = [
        "# Zoomies settings, read by the systemd unit at every start (EnvironmentFile=).",
        "# Written once by `zoomies install`, which never overwrites it. One NAME=value a line;",
        "# any setting of the Settings page can be set as ZOOMIES_<KEY> (dots as underscores), and",
        "# a secret from a file only the service user reads: ZOOMIES_<KEY>_FILE=/path.",
        f"ZOOMIES_DATA_DIR={layout.data_dir}",
    ]
    for key in ENV_FILE_SETTINGS:
        setting = registry.entry(key)
        default = "" if isinstance(setting.default, list) else setting.default
        if isinstance(default, bool):
            default = str(default).lower()
        lines += ["", f"# {setting.help}", f"#{setting.env}={default}"]
    for name, default, help_text in PROCESS_VARIABLES:
        lines += ["", f"# {help_text}", f"#{name}={default}"]
    return "\n".join(lines) + "\n"


def read_env_file(path: Path) -> dict[str, str]:
    """NAME=value lines as systemd reads an EnvironmentFile (comments with # or ;, values
    optionally quoted); a missing file is empty, as the unit's leading `-` allows."""
    values: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return values
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        name, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[name.strip()] = value
    return values


def unit_environment(layout: Layout) -> dict[str, str]:
    """The environment the unit's commands get: Environment=, then the environment file
    (whose values win, as systemd's do), with the data directory reached through the root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_NOT)}
    env["ZOOMIES_DATA_DIR"] = str(layout.data_dir)
    env.update(read_env_file(layout.host(layout.env_file)))
    env["ZOOMIES_DATA_DIR"] = str(layout.host(Path(env["ZOOMIES_DATA_DIR"])))
    return env


@dataclass
class Manifest:
    """What one install wrote, kept as JSON in the data directory. Paths are the installed
    system's; `files` maps each to the SHA-256 it had when written."""

    data_dir: str
    unit: str
    env_file: str
    user: str
    program: list[str]
    data_dir_created: bool = False
    user_created: bool = False
    files: dict[str, str] = field(default_factory=dict)
    directories: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    installed_at: str = ""
    format: int = MANIFEST_FORMAT

    @classmethod
    def load(cls, path: Path) -> Manifest | None:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise InstallError(
                f"{path} cannot be read ({exc}): remove what it lists by hand"
            ) from exc
        if raw.get("format") != MANIFEST_FORMAT:
            raise InstallError(f"{path} is of format {raw.get('format')!r}, not {MANIFEST_FORMAT}")
        return cls(**raw)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n")
        path.chmod(0o640)


def _make_dirs(layout: Layout, target: Path, made: list[str]) -> None:
    """`target` and its missing parents, each one made recorded (outermost first)."""
    missing = []
    for path in [target, *target.parents]:
        if path == Path("/") or layout.host(path).exists():
            break  # the root is the operator's, and install checked it is there
        missing.append(path)
    for path in reversed(missing):
        layout.host(path).mkdir(mode=0o755)
        _record_dir(made, path)


def _record_dir(made: list[str], path: Path) -> None:
    if str(path) not in made:
        made.append(str(path))


def _tree(top: Path) -> Iterator[Path]:
    if top.exists():
        yield from top.rglob("*")


@dataclass
class Installer:
    """One install or uninstall; `say` prints a line for the operator."""

    layout: Layout
    program: Program
    say: Callable[[str], None]

    def command(self, *args: str) -> list[str]:
        return [*self.program.argv, *args]

    # --- install ------------------------------------------------------------------------

    def install(self, *, dry_run: bool = False) -> bool:
        """Install; returns whether the configuration checks passed (the files stay either way,
        recorded, so that uninstall can take them back)."""
        layout = self.layout
        if not layout.root.is_dir():
            raise InstallError(f"--root {layout.root} is not a directory")
        unit_text = render_unit(layout, self.program)
        env_host = layout.host(layout.env_file)
        previous = Manifest.load(layout.host(layout.manifest))
        self._check_unit_is_ours(unit_text, previous)
        if dry_run:
            return self._dry_run(unit_text, env_host)

        manifest = previous or Manifest(
            data_dir=str(layout.data_dir),
            unit=str(layout.unit_file),
            env_file=str(layout.env_file),
            user=layout.user,
            program=list(self.program.argv),
        )
        manifest.program, manifest.skipped = list(self.program.argv), []
        manifest.installed_at = datetime.now(UTC).isoformat(timespec="seconds")
        if not layout.host(layout.data_dir).exists():
            manifest.data_dir_created = True
        for directory in (layout.unit_dir, layout.env_file.parent, layout.data_dir):
            _make_dirs(layout, directory, manifest.directories)
        layout.host(layout.data_dir).chmod(0o750)

        self._write(layout.unit_file, unit_text, 0o644, manifest)
        if env_host.exists():
            named = read_env_file(env_host).get("ZOOMIES_DATA_DIR")
            self.say(f"Kept {layout.env_file}: it is there already (install never overwrites it).")
            if named and Path(named) != layout.data_dir:
                self.say(f"  It names ZOOMIES_DATA_DIR={named}, which wins over {layout.data_dir}.")
        else:
            self._write(layout.env_file, env_file_text(layout), 0o640, manifest)
        run_as = self._service_user(manifest)
        self._collect_static(manifest, run_as)
        manifest.save(layout.host(layout.manifest))
        self.say(f"Recorded what install wrote in {layout.manifest}.")
        for step in manifest.skipped:
            self.say(f"Skipped (not the real system's root, or not root): {step}")
        passed = self._check_configuration(run_as)
        self._left_to_do(passed)
        return passed

    def _check_unit_is_ours(self, unit_text: str, previous: Manifest | None) -> None:
        unit_host = self.layout.host(self.layout.unit_file)
        if not unit_host.exists():
            return
        digest = sha256(unit_host)
        recorded = previous.files.get(str(self.layout.unit_file)) if previous else None
        if digest not in (recorded, hashlib.sha256(unit_text.encode()).hexdigest()):
            raise InstallError(
                f"{self.layout.unit_file} is there and is not the unit install wrote: "
                "move it away (or uninstall the other install) and run install again"
            )

    def _write(self, path: Path, text: str, mode: int, manifest: Manifest) -> None:
        host = self.layout.host(path)
        host.write_text(text)
        host.chmod(mode)
        manifest.files[str(path)] = sha256(host)
        self.say(f"Wrote {path}.")

    def _service_user(self, manifest: Manifest) -> pwd.struct_passwd | None:
        """The service user, made if missing, owning the data directory (and reading the
        environment file through its group); None where that cannot be done here."""
        layout, user = self.layout, self.layout.user
        data_dir = layout.data_dir
        useradd = [
            "useradd", "--system", "--user-group", "--no-create-home",
            "--home-dir", str(data_dir), "--shell", shutil.which("nologin") or "/usr/sbin/nologin",
            user,
        ]  # fmt: skip
        chown = f"chown -R {user}: {data_dir}; chgrp {user} {layout.env_file}"
        if not layout.acts_as_root:
            manifest.skipped += [f"{' '.join(useradd)} (if {user} is missing)", chown]
            return None
        try:
            account = pwd.getpwnam(user)
        except KeyError:
            done = subprocess.run(useradd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise InstallError(f"useradd failed: {done.stderr.strip()}") from None
            manifest.user_created = True
            self.say(f"Made the service user {user}.")
            account = pwd.getpwnam(user)
        for path in [data_dir, *_tree(data_dir)]:  # the real root: each path is its own host path
            os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)
        env_file = layout.env_file
        if str(env_file) in manifest.files:  # ours: the service user's group reads it
            os.chown(env_file, 0, account.pw_gid)
        return account

    def _run(
        self, args: list[str], run_as: pwd.struct_passwd | None
    ) -> subprocess.CompletedProcess:
        """A command of the unit's program, in the unit's environment and working directory,
        as the service user when this process may become it."""
        env = unit_environment(self.layout)
        extra: dict = {}
        if run_as is not None:
            extra = {"user": run_as.pw_uid, "group": run_as.pw_gid, "extra_groups": []}
            env["HOME"] = run_as.pw_dir
        cwd = self.program.working_directory(self.layout)
        return subprocess.run(
            self.command(*args),
            env=env,
            cwd=cwd if self.program.checkout else self.layout.host(cwd),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            check=False,
            **extra,
        )

    def _collect_static(self, manifest: Manifest, run_as: pwd.struct_passwd | None) -> None:
        layout = self.layout
        static = layout.data_dir / STATIC_SUBDIR
        before = set(_tree(layout.host(static)))
        static_existed = layout.host(static).exists()
        done = self._run(["collectstatic", "--noinput", "--verbosity", "0"], run_as)
        if done.returncode != 0:
            manifest.save(layout.host(layout.manifest))  # what was written so far, for uninstall
            raise InstallError(
                f"collectstatic failed (as the unit would run it):\n{done.stderr.strip()}"
            )
        if not static_existed:
            _record_dir(manifest.directories, static)
        made = sorted(set(_tree(layout.host(static))) - before)
        for host in made:
            path = Path("/") / host.relative_to(layout.root)
            if host.is_dir():
                _record_dir(manifest.directories, path)
            else:
                manifest.files[str(path)] = sha256(host)
        self.say(f"Collected the static files into {static} ({len(made)} new).")

    def _check_configuration(self, run_as: pwd.struct_passwd | None) -> bool:
        done = self._run(["check_config"], run_as)
        for line in (done.stderr + done.stdout).strip().splitlines():
            self.say(f"  {line}")
        if done.returncode != 0:
            self.say(
                f"The configuration has errors: the controller will not start until they are "
                f"fixed (in {self.layout.env_file}); `zoomies check_config` checks it again."
            )
            return False
        self.say("The configuration checks pass.")
        return True

    def _left_to_do(self, passed: bool) -> None:
        layout = self.layout
        name = layout.unit_name.removesuffix(".service")
        # As the unit runs it: its Environment=, then the environment file (which wins).
        as_user = (
            f"sudo -u {layout.user} sh -c 'set -a; ZOOMIES_DATA_DIR={layout.data_dir}; "
            f". {layout.env_file}; set +a; "
            f"cd {self.program.working_directory(layout)}; exec {' '.join(self.command())}"
        )
        steps = [
            f"Settings: {layout.env_file} (the server's bind address and TLS, the database).",
            "The GitHub App: its id, private key file and webhook secret in the same file "
            "(README, Configuration), pointing the App's webhook at /webhooks/github.",
            f"systemctl daemon-reload && systemctl enable --now {name}",
            f"The first admin: {as_user} create_admin NAME'",
            f"Check it: curl -s http://127.0.0.1:8080/healthz, journalctl -u {name}",
        ]
        if not passed:
            steps.insert(0, "Fix the configuration errors above.")
        if not layout.real_root:
            steps.insert(
                0, f"Everything above was written under {layout.root}, not on this system."
            )
        self.say("Left to do:")
        for number, step in enumerate(steps, 1):
            self.say(f"  {number}. {step}")

    def _dry_run(self, unit_text: str, env_host: Path) -> bool:
        layout = self.layout
        self.say(f"Would write {layout.unit_file}:")
        self.say(unit_text)
        if env_host.exists():
            self.say(f"Would keep {layout.env_file}: it is there already.")
        else:
            self.say(f"Would write {layout.env_file}:")
            self.say(env_file_text(layout))
        self.say(f"Would make {layout.data_dir} (mode 0750), owned by {layout.user}.")
        for step in ("collectstatic --noinput", "check_config"):
            self.say(f"Would run: {' '.join(self.command(step))}")
        self.say(f"Would record it all in {layout.manifest}. Nothing was written.")
        return True

    # --- uninstall ----------------------------------------------------------------------

    def uninstall(self, *, purge_data: bool = False) -> None:
        layout = self.layout
        manifest = Manifest.load(layout.host(layout.manifest))
        if manifest is None:
            raise InstallError(
                f"no {layout.manifest}: nothing is known of what install wrote there "
                "(pass the --root and --data-dir the install had)"
            )
        data_dir = Path(manifest.data_dir)
        for name, digest in sorted(manifest.files.items()):
            host = layout.host(Path(name))
            if not host.exists():
                continue
            if sha256(host) != digest:
                self.say(f"Left {name}: it changed since install wrote it.")
                continue
            host.unlink()
            if not Path(name).is_relative_to(data_dir / STATIC_SUBDIR):
                self.say(f"Removed {name}.")
        layout.host(layout.manifest).unlink()
        self.say(f"Removed the static files install collected and {layout.manifest}.")
        if purge_data:
            self._purge(manifest, data_dir)
        data_kept = layout.host(data_dir).exists()
        for name in sorted(manifest.directories, key=lambda d: d.count("/"), reverse=True):
            path = Path(name)
            if path.is_relative_to(data_dir) and not path.is_relative_to(data_dir / STATIC_SUBDIR):
                continue  # the data directory: kept, or purged above
            if data_kept and path in data_dir.parents:
                continue  # not empty: the data directory is in it
            self._remove_if_empty(path)
        if layout.host(data_dir).exists():
            self.say(f"Kept the data directory {data_dir} with its database (rm -r to remove it).")
        if manifest.user_created:
            self._user_made_by_install(manifest, purge_data)

    def _remove_if_empty(self, path: Path) -> None:
        host = self.layout.host(path)
        try:
            host.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            self.say(f"Left {path}: not empty.")

    def _purge(self, manifest: Manifest, data_dir: Path) -> None:
        if not manifest.data_dir_created:
            self.say(
                f"Kept {data_dir}: it was there before install, so it is not install's to remove."
            )
            return
        shutil.rmtree(self.layout.host(data_dir))
        self.say(f"Removed the data directory {data_dir} and everything in it.")

    def _user_made_by_install(self, manifest: Manifest, purge_data: bool) -> None:
        if not purge_data:
            self.say(f"Kept the service user {manifest.user} install made (its data stays).")
            return
        if not self.layout.acts_as_root:
            self.say(f"Skipped: userdel {manifest.user} (not root on the real system).")
            return
        done = subprocess.run(
            ["userdel", manifest.user], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            self.say(f"Removed the service user {manifest.user} install made.")
        else:
            self.say(f"userdel {manifest.user} failed: {done.stderr.strip()}")
