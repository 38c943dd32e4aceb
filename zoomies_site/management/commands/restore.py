"""`python manage.py restore BACKUP` (BAK-05; docs/backup.md)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from zoomies_site.backup import cli, service


class Command(BaseCommand):
    help = (
        "Put a backup back as the live database: a file name in backup.dir, a path, or an "
        "s3://bucket/prefix/<file> URL. Refused while a controller holds the database."
    )

    def add_arguments(self, parser):
        parser.add_argument("backup")
        parser.add_argument("--passphrase-file", help="a file holding the passphrase")
        parser.add_argument(
            "--force", action="store_true",
            help="restore even though a controller holds the lock or the lease",
        )  # fmt: skip

    def handle(self, *args, **options):
        source = options["backup"]
        encrypted = source.endswith(".enc")
        secret = cli.passphrase(options, needed=encrypted)
        try:
            restored = service.restore(
                source,
                actor=service.cli_actor(),
                passphrase=secret,
                force=options["force"],
                stream=self.stdout._out,
            )
        except service.BackupError as exc:
            raise CommandError(str(exc)) from None
        for check in restored.report.checks:
            self.stdout.write(f"ok   {check.name}: {check.detail}")
        if restored.aside:
            self.stdout.write(f"the database it replaced is kept at {restored.aside}")
        if restored.pending_migrations:
            self.stdout.write(
                f"{len(restored.pending_migrations)} migration(s) will be applied when the "
                "controller starts"
            )
        self.stdout.write(self.style.SUCCESS(f"restored {restored.report.path.name}"))
