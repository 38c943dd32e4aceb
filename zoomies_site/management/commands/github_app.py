"""`zoomies github_app create [--organization ORG] [--name NAME]` and `zoomies github_app
convert CODE`: the GitHub App manifest flow for a host with no browser of its own (ARCH-11).

`create` writes an HTML page holding the manifest form (the same the Settings page posts);
opened in any browser and submitted, GitHub shows the App and, once it is created, sends
the browser to this controller's /settings/github-app/created?code=...: copy the code from
that address into `convert`, which stores the App's id, key and webhook secret (sealed) as
the Settings page would. The code works once, for an hour.
"""

from __future__ import annotations

import html
import secrets
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from runners.github import manifest
from zoomies_site import github_app
from zoomies_site.core import registry

ACTOR = "cli:github_app"


class Command(BaseCommand):
    help = "Create the GitHub App from a manifest without the Settings page (create, convert)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="write the page that posts the manifest to GitHub")
        create.add_argument("--organization", default="", help="the organization to own it")
        create.add_argument("--name", default="Zoomies runners", help="the App's name on GitHub")
        create.add_argument("--out", default="github-app.html", help="where to write the page")
        convert = sub.add_parser("convert", help="store the App GitHub made, from its code")
        convert.add_argument("code", help="the code in the address GitHub sent the browser to")

    def handle(self, *args, **options):
        try:
            if options["action"] == "create":
                self._create(options)
            else:
                app = manifest.convert(registry.get("github.api_url"), options["code"])
                github_app.store(app, actor=ACTOR, now=timezone.now())
                self.stdout.write(
                    f"GitHub App {app.slug} (id {app.app_id}) is stored; its key and webhook "
                    f"secret are sealed. Install it: {app.install_url}"
                )
        except (github_app.AppSetupRefused, manifest.ConversionFailed) as exc:
            raise CommandError(str(exc)) from None

    def _create(self, options) -> None:
        document = manifest.manifest_json(name=options["name"], public_url=github_app.public_url())
        action = manifest.new_app_url(registry.get("github.api_url"),
                                      state=secrets.token_urlsafe(16),
                                      organization=options["organization"])  # fmt: skip
        page = (
            "<!doctype html><meta charset=utf-8><title>Create the Zoomies GitHub App</title>"
            f'<form method="post" action="{html.escape(action)}">'
            f'<input type="hidden" name="manifest" value="{html.escape(document)}">'
            "<p>GitHub shows the App Zoomies asks for; create it there, then copy the code "
            "from the address it sends you to into <code>zoomies github_app convert CODE</code>."
            '<p><button type="submit">Continue to GitHub</button></form>'
        )
        out = Path(options["out"])
        out.write_text(page, encoding="utf-8")
        self.stdout.write(f"Open {out.resolve()} in a browser and continue to GitHub.")
