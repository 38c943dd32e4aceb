"""`python manage.py create_admin NAME`: the first user, an admin, with a password you choose.

The password is read from the terminal (asked twice), or from ZOOMIES_ADMIN_PASSWORD (or the
file ZOOMIES_ADMIN_PASSWORD_FILE names) or --password-file for unattended installs, and
hashed with argon2id (AUTH-01).
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from django.contrib.auth.password_validation import ValidationError, validate_password
from django.core.management.base import BaseCommand, CommandError

from accounts import actions
from accounts.models import User
from zoomies_site.core import environment

PASSWORD_ENV = "ZOOMIES_ADMIN_PASSWORD"  # noqa: S105  # a name or prefix, not a secret


class Command(BaseCommand):
    help = "Create an admin user (the first sign-in), asking for the password."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument("--password-file", help=f"read the password here (or {PASSWORD_ENV})")

    def handle(self, *args, username, email, password_file, **options):
        if User.objects.filter(username=username).exists():
            raise CommandError(f"a user called {username!r} already exists")
        password = self._password(password_file)
        try:
            validate_password(password, User(username=username, email=email))
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        try:
            actions.create_user(
                username=username,
                role=User.Role.ADMIN,
                password=password,
                email=email,
                actor="cli:create_admin",
            )
        except actions.AccountError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            self.style.SUCCESS(f"Admin {username!r} created: sign in at /admin/ with it.")
        )

    def _password(self, password_file: str | None) -> str:
        if password_file:
            try:
                return Path(password_file).read_text().rstrip("\n")
            except OSError as exc:
                raise CommandError(f"cannot read {password_file}: {exc.strerror}") from None
        from_env = environment.read(PASSWORD_ENV, file=True)
        if from_env:
            return from_env
        if not os.isatty(0):
            raise CommandError(f"no terminal to ask: set {PASSWORD_ENV} or use --password-file")
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Password (again): "):
            raise CommandError("the two passwords differ")
        return first
