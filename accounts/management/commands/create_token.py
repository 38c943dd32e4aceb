"""`python manage.py create_token --user NAME [--scope fleet:read] ...`: mint an API token."""

from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts.models import User
from accounts.permissions import ALL_SCOPES, READ_SCOPE
from accounts.tokens import create_api_token


class Command(BaseCommand):
    help = "Create an API token for a user and print its secret once."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username (created if --create-user)")
        parser.add_argument("--create-user", action="store_true")
        parser.add_argument("--name", default="cli")
        parser.add_argument(
            "--scope", action="append", choices=ALL_SCOPES, help=f"repeatable; default {READ_SCOPE}"
        )
        parser.add_argument("--days", type=int, default=90, help="lifetime; 0 = no expiry")

    def handle(self, *args, **options):
        user = User.objects.filter(username=options["user"]).first()
        if user is None:
            if not options["create_user"]:
                raise CommandError(f"no user {options['user']!r} (add --create-user)")
            user = User.objects.create_user(username=options["user"], role=User.Role.OPERATOR)
        expires = timezone.now() + timedelta(days=options["days"]) if options["days"] else None
        _token, secret = create_api_token(
            user=user,
            name=options["name"],
            scopes=options["scope"] or [READ_SCOPE],
            expires_at=expires,
            actor="cli:create_token",
        )
        self.stdout.write(secret)
