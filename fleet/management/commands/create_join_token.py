"""`python manage.py create_join_token [--ttl 1h]`: mint a single-use join token and print it."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from fleet.actions import create_join_token
from zoomies_site.core.registry import format_duration, parse_duration


class Command(BaseCommand):
    """Print a join token; `zoomies agent --join <token>` on a host exchanges it (AUTH-08)."""

    help = "Mint a short-lived, single-use join token for a new host and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ttl", default="1h", help="how long the token stays valid: 90s, 20m, 1h (default 1h)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            ttl = parse_duration(options["ttl"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if ttl.total_seconds() <= 0:
            raise CommandError("--ttl must be positive")
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        token, secret = create_join_token(now=timezone.now(), actor=f"cli:{user}", ttl=ttl)
        self.stdout.write(secret)
        self.stderr.write(
            f"valid for {format_duration(ttl)}, until {token.expires_at:%Y-%m-%d %H:%M:%S %Z}; "
            "single use, shown only now"
        )
