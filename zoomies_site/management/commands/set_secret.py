"""`python manage.py set_secret KEY --from-file PATH | --stdin | --reset`: store a secret sealed.

The value never passes through argv or shell history: it is read from a file or from
standard input, validated and sealed by `actions.set_setting` (AUTH-07), and audited as
"cli:set_secret". Only the key and where the sealing key came from are printed.

    python manage.py set_secret github.private_key --from-file app.pem
    printf '%s\\n' "$SECRET" | python manage.py set_secret github.webhook_secrets --stdin

A list secret (`github.webhook_secrets`) takes one item per line, as its `_FILE` variable
does; any other secret is the whole text, without its surrounding whitespace.
"""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from zoomies_site.actions import InvalidSetting, reset_setting, set_setting
from zoomies_site.core import registry, sealing

ACTOR = "cli:set_secret"
# A setting used instead of the secret when it comes from a later layer (runners.github.config).
_SHADOWED_BY = {"github.private_key": "github.private_key_file"}


def _secret_keys() -> list[str]:
    return [key for key, setting in registry.SETTINGS.items() if setting.secret]


class Command(BaseCommand):
    help = "Store a secret setting sealed in the database, read from a file or standard input."
    # call_command(..., input_stream=io.StringIO(...)) in tests; sys.stdin otherwise.
    stealth_options = ("input_stream",)

    def add_arguments(self, parser):
        parser.add_argument("key", help=f"the secret setting: {', '.join(_secret_keys())}")
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--from-file", metavar="PATH", help="read the value from PATH")
        source.add_argument("--stdin", action="store_true", help="read the value from stdin")
        source.add_argument("--reset", action="store_true", help="delete the stored value instead")

    def handle(self, *args, **options):
        key = options["key"]
        setting = registry.SETTINGS.get(key)
        if setting is None or not setting.secret:
            raise CommandError(
                f"{key} is not a secret setting; set_secret takes one of "
                f"{', '.join(_secret_keys())}."
            )
        if options["reset"]:
            try:
                removed = reset_setting(key, actor=ACTOR)
            except InvalidSetting as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"{key}: {'removed' if removed else 'nothing was stored'}")
            return

        text = self._read(options)
        if setting.type == registry.LIST:
            value: object = [line.strip() for line in text.splitlines() if line.strip()]
        else:
            value = text.strip()
        if not value:
            raise CommandError(
                f"nothing to store for {key}: the input is empty (--reset removes it)"
            )
        try:
            set_setting(key, value, actor=ACTOR)
        except InvalidSetting as exc:
            raise CommandError(str(exc)) from None  # its message masks the value
        self.stdout.write(f"{key}: stored sealed; the sealing key is from {sealing.key_source()}")
        registry.reload()
        values = registry.current()
        if values.source(key) == "env":
            self.stderr.write(f"Note: the environment ({setting.env}) overrides the stored {key}.")
        shadow = _SHADOWED_BY.get(key)
        if shadow and values.source(shadow) == "env":
            self.stderr.write(
                f"Note: {registry.SETTINGS[shadow].env} is set, so the environment's {shadow} "
                f"is used instead of the stored {key}."
            )

    def _read(self, options) -> str:
        path = options["from_file"]
        if path:
            try:
                return Path(path).read_text()
            except OSError as exc:
                raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
            except UnicodeDecodeError:
                raise CommandError(f"cannot read {path}: it is not UTF-8 text") from None
        stream = options.get("input_stream") or sys.stdin
        return stream.read()
