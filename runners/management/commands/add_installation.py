"""`python manage.py add_installation --id N --account acme [--kind org] [--repo acme/app]`.

Records a GitHub App installation Zoomies should serve (until the installation webhooks and
the UI manage them).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import transaction

from accounts import audit
from runners.models import Installation


class Command(BaseCommand):
    help = "Add or update a GitHub App installation."

    def add_arguments(self, parser):
        parser.add_argument("--id", type=int, required=True, help="the installation id")
        parser.add_argument("--account", required=True, help="the org or user login")
        parser.add_argument("--kind", choices=Installation.Kind.values, default="org")
        parser.add_argument("--repo", action="append", default=[], help="owner/name; repeatable")

    def handle(self, *args, **options):
        with transaction.atomic():
            installation, created = Installation.objects.update_or_create(
                github_id=options["id"],
                defaults={
                    "account": options["account"],
                    "kind": options["kind"],
                    "repositories": options["repo"],
                    "active": True,
                },
            )
            audit.record(
                actor="cli:add_installation",
                action="installation.create" if created else "installation.update",
                target=installation,
            )
        self.stdout.write(f"installation {installation.github_id} ({installation.account})")
