"""`python manage.py create_token --user NAME [--scope fleet:read] ...`: mint an API token.

Kept for scripts that use it; `manage.py token create|list|revoke` is the full command.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts import actions
from accounts.models import User
from accounts.roles import ALL_SCOPES, READ_SCOPE


class Command(BaseCommand):
    help = "Create an API token for a user and print its secret once."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username (created if --create-user)")
        parser.add_argument("--create-user", action="store_true", help="as an operator")
        parser.add_argument("--name", default="cli")
        parser.add_argument(
            "--scope", action="append", choices=ALL_SCOPES, help=f"repeatable; default {READ_SCOPE}"
        )
        parser.add_argument("--days", type=int, default=90, help="lifetime; 0 = no expiry")

    def handle(self, *args, **options):
        user = User.objects.filter(username=options["user"]).first()
        try:
            if user is None:
                if not options["create_user"]:
                    raise CommandError(f"no user {options['user']!r} (add --create-user)")
                user = actions.create_user(
                    username=options["user"], role=User.Role.OPERATOR, actor="cli:create_token"
                )
            expires = timezone.now() + timedelta(days=options["days"]) if options["days"] else None
            _token, secret = actions.create_api_token(
                user=user,
                name=options["name"],
                scopes=options["scope"] or [READ_SCOPE],
                expires_at=expires,
                actor="cli:create_token",
            )
        except actions.AccountError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(secret)
