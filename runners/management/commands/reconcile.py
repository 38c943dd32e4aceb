"""`python manage.py reconcile --once`: one reconcile pass under the lease, then exit."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from runners.reconcile import reconcile_now


class Command(BaseCommand):
    help = "Run the reconcile pass (decide and apply) once."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one pass and exit")

    def handle(self, *args, **options):
        if not options["once"]:
            raise CommandError("only --once is supported; the controller runs the loop")
        reports = reconcile_now()
        if reports is None:
            raise CommandError("another reconcile pass holds the lease; try again shortly")
        for report in reports:
            for line in report.created + report.failed + report.drained + report.skipped:
                self.stdout.write(line)
            for line in report.demand:
                self.stdout.write(f"demand: {line}")
        self.stdout.write(self.style.SUCCESS(f"{len(reports)} pass(es) done"))
