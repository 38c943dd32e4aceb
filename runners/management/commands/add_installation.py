"""`python manage.py add_installation --id N --account acme [--kind org] [--repo acme/app]`.

Records a GitHub App installation Zoomies should serve (until the installation webhooks and
the UI manage them).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from runners.actions import installations as installation_actions
from runners.models import Installation


class Command(BaseCommand):
    help = "Add or update a GitHub App installation."

    def add_arguments(self, parser):
        parser.add_argument("--id", type=int, required=True, help="the installation id")
        parser.add_argument("--account", required=True, help="the org or user login")
        parser.add_argument("--kind", choices=Installation.Kind.values, default="org")
        parser.add_argument("--repo", action="append", default=[], help="owner/name; repeatable")

    def handle(self, *args, **options):
        # The API's writer and validation: an id past a bigint or a bad repository name is a
        # clear error, not a traceback, and the audit row is the same.
        try:
            installation, _ = installation_actions.add_installation(
                github_id=options["id"],
                account=options["account"],
                kind=options["kind"],
                repositories=options["repo"],
                actor="cli:add_installation",
                now=timezone.now(),
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"installation {installation.github_id} ({installation.account})")
