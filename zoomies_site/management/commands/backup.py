"""`python manage.py backup [take|list|verify|upload]` (BAK-01..04; docs/backup.md)."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from zoomies_site.backup import cli, service
from zoomies_site.core import registry


class Command(BaseCommand):
    help = "Take, list, verify or upload a backup of the database (default: take one)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action")
        take = sub.add_parser("take", help="take a consistent copy (the default)")
        listing = sub.add_parser("list", help="the backups in backup.dir, newest first")
        verify = sub.add_parser("verify", help="checksum, decrypt, open, integrity, migrations")
        verify.add_argument("backup", help="a file name in backup.dir, or a path")
        upload = sub.add_parser("upload", help="copy a backup to remotes")
        upload.add_argument("backup", help="a file name in backup.dir, or a path")
        for p in (parser, take):
            p.add_argument(
                "--encrypt",
                action="store_true",
                help="encrypt (backup.passphrase, --passphrase-file or a prompt)",
            )
            p.add_argument(
                "--remote",
                action="append",
                default=[],
                metavar="S3_URL",
                help="also copy to this s3://bucket/prefix (repeatable)",
            )
            p.add_argument(
                "--upload", action="store_true", help="also copy to every remote in backup.remotes"
            )
            p.add_argument("--dir", help="where to write it (default: backup.dir)")
        for p in (parser, take, verify):
            p.add_argument("--passphrase-file", help="a file holding the passphrase")
        for p in (listing, verify):
            p.add_argument("--json", action="store_true", help="print JSON")
        listing.add_argument("--remote", metavar="S3_URL", help="list this remote instead")
        upload.add_argument("--remote", action="append", default=[], metavar="S3_URL")

    def handle(self, *args, **options):
        action = options.get("action") or "take"
        try:
            return getattr(self, f"_{action}")(options)
        except service.BackupError as exc:
            raise CommandError(str(exc)) from None

    def _remotes(self, options) -> list[str]:
        remotes = list(options.get("remote") or [])
        if options.get("upload"):
            remotes += [r for r in registry.get("backup.remotes") if r not in remotes]
        return remotes

    def _take(self, options):
        secret = cli.passphrase(options, needed=options.get("encrypt"), confirm=True)
        taken = service.take(
            actor=service.cli_actor(),
            passphrase=secret,
            directory=Path(options["dir"]) if options.get("dir") else None,
            remotes=self._remotes(options),
            stream=self.stdout._out,
        )
        m = taken.manifest
        self.stdout.write(
            f"{taken.path} ({m['size']} bytes, sha256 {m['sha256'][:16]}…, "
            f"{len(m['migrations'])} migrations, {'encrypted' if m['encrypted'] else 'plain'})"
        )
        for url in taken.uploaded:
            self.stdout.write(f"copied to {url}")

    def _list(self, options):
        where = options.get("remote") or service.backup_dir()
        found = (
            service.list_remote(options["remote"])
            if options.get("remote")
            else service.list_backups()
        )
        if options.get("json"):
            self.stdout.write(json.dumps(found, indent=2))
            return
        if not found:
            self.stdout.write(f"no backups in {where}")
        for entry in found:
            if entry.get("error"):
                self.stdout.write(f"{entry['file']}  unreadable manifest: {entry['error']}")
                continue
            flags = ["encrypted" if entry["encrypted"] else "plain"]
            if not entry.get("present", True):
                flags.append("FILE MISSING")
            self.stdout.write(
                f"{entry.get('url', entry['file'])}  {entry['created_at']}  {entry['size']} bytes  "
                f"{entry['engine']}  by {entry['created_by']}  {', '.join(flags)}"
            )

    def _verify(self, options):
        path = service.resolve(options["backup"])
        encrypted = path.exists() and service.read_manifest(path).get("encrypted")
        secret = cli.passphrase(options, needed=bool(encrypted))
        report = service.verify(options["backup"], passphrase=secret, stream=self.stdout._out)
        if options.get("json"):
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            for check in report.checks:
                self.stdout.write(f"{'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
        if not report.ok:
            raise CommandError(f"{report.path.name} failed verification")
        if not options.get("json"):
            self.stdout.write(self.style.SUCCESS(f"{report.path.name} verified"))

    def _upload(self, options):
        path = service.resolve(options["backup"])
        remotes = self._remotes({**options, "upload": not options.get("remote")})
        if not remotes:
            raise CommandError("no remote: give --remote s3://bucket/prefix or set backup.remotes")
        for url in remotes:
            service.upload(path, url, stream=self.stdout._out)
            self.stdout.write(f"copied {path.name} to {url}")
