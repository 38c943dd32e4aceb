"""`manage.py fake_github`: the fake GitHub in the foreground until SIGINT/SIGTERM.

A thin wrapper: the work is in runners.github.fake.cli, which `python -m
runners.github.fake` runs without Django.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runners.github.fake.cli import add_arguments, serve


class Command(BaseCommand):
    """Run the fake GitHub on 127.0.0.1, print its URL and App id, stop on a signal."""

    help = __doc__.splitlines()[0]
    requires_system_checks: list[str] = []  # the fake needs nothing from the project

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        def out(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        serve(options, out=out)
