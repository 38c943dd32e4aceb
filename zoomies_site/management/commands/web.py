"""`python manage.py web`: the web tier alone, for scale-out (issue 26 item 4).

The UI, the API, webhooks, the agent protocol and the event streams, with no workers, no
embedded agent and no controller lock: any number of these run beside `manage.py workers`
on PostgreSQL and Redis, on one machine (`--reuse-port` shares one port between them) or
several (behind any proxy). Migrations are `manage.py migrate`'s, run once before.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import connection

from zoomies_site.management.commands.controller import bind_in_use, check_configuration


class Command(BaseCommand):
    help = "Serve the web tier alone (scale-out): UI, API, webhooks, agent protocol, SSE."

    def add_arguments(self, parser):
        parser.add_argument("--bind", help="HOST:PORT to serve on (default: server.bind)")
        parser.add_argument(
            "--reuse-port", action="store_true", help="share the port with other web processes"
        )

    def handle(self, *args, **options):
        host, port = bind_in_use(options["bind"])
        check_configuration(self.stderr)
        connection.close()  # the server's threads open their own
        from zoomies_site import server  # noqa: PLC0415  # daphne's reactor: this process's own

        argv = ["--bind", f"{host}:{port}"]
        if options["reuse_port"]:
            argv.append("--reuse-port")
        server.main(argv)
