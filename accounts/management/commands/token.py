"""`python manage.py token create|list|revoke`: API tokens from the command line.

manage.py token create --user ada --name ci --scope fleet:read --days 90
manage.py token list [--user ada] [--all]
manage.py token revoke zpt_AbCd1234      (the prefix `list` shows, or the id)
"""

from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts import actions
from accounts.models import ApiToken, User
from accounts.roles import ALL_SCOPES, READ_SCOPE

ACTOR = "cli:token"


class Command(BaseCommand):
    help = "Create, list and revoke API tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        create = sub.add_parser("create", help="mint a token and print its secret once")
        create.add_argument("--user", required=True)
        create.add_argument("--name", default="cli")
        create.add_argument(
            "--scope", action="append", choices=ALL_SCOPES, help=f"repeatable; default {READ_SCOPE}"
        )
        create.add_argument("--days", type=int, default=90, help="lifetime; 0 = no expiry")
        listing = sub.add_parser("list", help="tokens, live ones unless --all")
        listing.add_argument("--user")
        listing.add_argument("--all", action="store_true", help="include revoked and expired")
        revoke = sub.add_parser("revoke", help="revoke by prefix or id (the row is kept)")
        revoke.add_argument("token")

    def handle(self, *args, verb, **options):
        getattr(self, f"_{verb}")(**options)

    def _create(self, *, user, name, scope, days, **_):
        owner = User.objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"no user {user!r}")
        if days < 0:
            raise CommandError("--days cannot be negative")
        expires = timezone.now() + timedelta(days=days) if days else None
        try:
            _token, secret = actions.create_api_token(
                user=owner, name=name, scopes=scope or [READ_SCOPE], expires_at=expires,
                actor=ACTOR,
            )  # fmt: skip
        except actions.AccountError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(secret)

    def _list(self, *, user, all, **_):
        tokens = ApiToken.objects.select_related("user").order_by("user__username", "created_at")
        if user:
            tokens = tokens.filter(user__username=user)
        now = timezone.now()
        for t in tokens:
            expired = t.expires_at is not None and t.expires_at <= now
            if not all and (t.revoked_at or expired):
                continue
            state = "revoked" if t.revoked_at else "expired" if expired else "live"
            expiry = f"expires {t.expires_at:%Y-%m-%d}" if t.expires_at else "no expiry"
            used = f"used {t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never used"
            scopes = ",".join(t.scopes) or "-"
            self.stdout.write(
                f"{t.id}\t{t.prefix}\t{t.user.get_username()}\t{t.name}\t{scopes}\t"
                f"{state}\t{expiry}\t{used}"
            )

    def _revoke(self, *, token, **_):
        rows = ApiToken.objects.select_related("user")
        found = list(rows.filter(id=int(token)) if token.isdigit() else rows.filter(prefix=token))
        if len(found) != 1:
            raise CommandError(
                f"{'no' if not found else 'more than one'} token matches {token!r} "
                "(manage.py token list --all shows ids and prefixes)"
            )
        if actions.revoke_api_token(found[0], actor=ACTOR):
            self.stdout.write(f"revoked {found[0]}")
        else:
            self.stdout.write(f"{found[0]} was already revoked")
