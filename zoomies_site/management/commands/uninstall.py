"""`zoomies uninstall`: removes what `install` recorded that it wrote, and nothing else (issue
26 item 1). A file changed since is left and named; the data directory stays unless
--purge-data."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from zoomies_site.installer import Installer, InstallError, Layout, Program
from zoomies_site.management.commands.install import add_place_arguments


class Command(BaseCommand):
    help = "Remove what `install` wrote (its manifest says what), and nothing else."
    requires_system_checks: list[str] = []  # as install: no configuration is needed to remove one

    def add_arguments(self, parser):
        add_place_arguments(parser)
        parser.add_argument(
            "--purge-data", action="store_true", help="remove the data directory too (the database)"
        )

    def handle(self, *args, **options):
        try:
            # The manifest in the data directory names the rest.
            layout = Layout(root=Path(options["root"]), data_dir=Path(options["data_dir"]))
            Installer(layout, Program.this_one(), self.stdout.write).uninstall(
                purge_data=options["purge_data"]
            )
        except (InstallError, PermissionError) as exc:
            raise CommandError(f"uninstall: {exc}") from exc
