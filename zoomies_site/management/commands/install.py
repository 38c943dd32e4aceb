"""`zoomies install` (or `manage.py install`): the controller as a systemd service (issue 26
item 1, ARCH-11). What it does and records: zoomies_site/installer.py."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from zoomies_site.installer import Installer, InstallError, Layout, Program

DEFAULT = Layout()


def add_place_arguments(parser) -> None:
    """The arguments install and uninstall share: where the install is."""
    parser.add_argument("--root", default=str(DEFAULT.root), help="install under this directory")
    parser.add_argument("--data-dir", default=str(DEFAULT.data_dir), help="the data directory")


class Command(BaseCommand):
    help = "Install the controller as a systemd service: unit, environment file, data directory."
    # The checks that matter are the unit's, run in its environment by the install itself;
    # this process's environment is whoever ran it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        add_place_arguments(parser)
        parser.add_argument("--env-file", default=str(DEFAULT.env_file))
        parser.add_argument(
            "--user", default=DEFAULT.user, help="the service user (made if missing)"
        )
        parser.add_argument("--unit-dir", default=str(DEFAULT.unit_dir))
        parser.add_argument("--dry-run", action="store_true", help="print it all, write nothing")

    def handle(self, *args, **options):
        try:
            layout = Layout(
                root=Path(options["root"]),
                data_dir=Path(options["data_dir"]),
                env_file=Path(options["env_file"]),
                unit_dir=Path(options["unit_dir"]),
                user=options["user"],
            )
            installer = Installer(layout, Program.this_one(), self.stdout.write)
            passed = installer.install(dry_run=options["dry_run"])
        except (InstallError, PermissionError) as exc:
            raise CommandError(f"install: {exc}") from exc
        if not passed:
            raise CommandError("install: written, but the configuration checks failed (above)")
