"""`zoomies check_config`: the configuration findings the controller checks at start, each
printed; exits 1 on an error among them. `install` runs it in the unit's environment."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from zoomies_site.management.commands.controller import check_configuration


class Command(BaseCommand):
    help = "Check the configuration as the controller does at start (errors exit 1)."

    def handle(self, *args, **options):
        check_configuration(self.stderr)
        self.stdout.write("The configuration has no errors.")
