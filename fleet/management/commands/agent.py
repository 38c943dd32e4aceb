"""`python manage.py agent --controller URL`: runs this host's agent (fleet/agent/)."""

from __future__ import annotations

import logging

from django.core.management.base import BaseCommand, CommandError

from fleet.agent.agent import AgentError
from fleet.agent.cli import add_arguments, agent_from_options


class Command(BaseCommand):
    """A thin wrapper: the agent itself is a plain HTTP client and never opens the database."""

    help = "Run this host's Zoomies agent. The join token comes from ZOOMIES_JOIN_TOKEN."

    def add_arguments(self, parser) -> None:
        add_arguments(parser)

    def handle(self, *args, **options) -> None:
        logger = logging.getLogger("fleet.agent")
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if options["verbosity"] > 1 else logging.INFO)
        try:
            agent_from_options(options).run()
        except (AgentError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
