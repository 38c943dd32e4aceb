"""What the `backup` and `restore` commands share: reading a passphrase."""

from __future__ import annotations

import getpass
import sys
from pathlib import Path

from django.core.management.base import CommandError

from zoomies_site.core import registry


def passphrase(options: dict, *, needed: bool, confirm: bool = False) -> str:
    """--passphrase-file, else backup.passphrase (ZOOMIES_BACKUP_PASSPHRASE[_FILE]), else a
    prompt on a terminal; "" when none is needed and none is given."""
    if options.get("passphrase_file"):
        try:
            text = Path(options["passphrase_file"]).read_text().rstrip("\n")
        except OSError as exc:
            raise CommandError(f"--passphrase-file: {exc}") from None
        if not text:
            raise CommandError("--passphrase-file holds an empty passphrase")
        return text
    configured = registry.get("backup.passphrase")
    if configured or not needed:
        return configured if needed else ""
    if not sys.stdin.isatty():
        raise CommandError(
            "a passphrase is needed: give --passphrase-file or set backup.passphrase"
        )
    first = getpass.getpass("Backup passphrase: ")
    if confirm and getpass.getpass("Again: ") != first:
        raise CommandError("the two passphrases differ")
    if not first:
        raise CommandError("an empty passphrase encrypts nothing")
    return first
