"""The controller's own agent: the same agent and the same HTTP protocol over loopback
(ARCH-04), run in a thread of the controller process (ARCH-02).

This module is the controller-side wiring (it may touch the database to mint the join token
and mark the host embedded); `fleet/agent/` itself never does.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from fleet.actions import create_join_token
from fleet.agent.cli import build_agent
from fleet.agent.state import StateStore
from fleet.models import Host
from runners import naming

log = logging.getLogger("zoomies.controller")


def embedded_host_name() -> str:
    """`zoomies-<hostname>`, cut to the host-name grammar."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", socket.gethostname().lower()).strip("-") or "local"
    name = f"zoomies-{cleaned}"[: naming.MAX_HOST_NAME].rstrip("-")
    naming.validate_host_name(name)
    return name


class EmbeddedAgent:
    """The agent thread; `stop()` leaves its runners running (AGENT-19)."""

    def __init__(self, agent, thread: threading.Thread):
        self.agent = agent
        self.thread = thread

    def stop(self) -> None:
        self.agent.request_stop()
        self.thread.join(timeout=45)


def start_embedded_agent(
    *, controller_url: str, state_dir: Path, capacity: int, ca_file: str | None = None
) -> EmbeddedAgent:
    """`ca_file` verifies the controller's own certificate when it serves HTTPS (the
    certificate itself, if self-signed, or its CA's bundle)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    name = embedded_host_name()
    environ: dict[str, str] = {}
    if not StateStore(state_dir).load().has_credentials_for(controller_url):
        # A short-lived token handed straight to the agent in memory; it never leaves here.
        _row, secret = create_join_token(
            now=timezone.now(), actor="system:controller", ttl=timedelta(minutes=5)
        )
        environ["ZOOMIES_JOIN_TOKEN"] = secret
    agent = build_agent(
        controller_url=controller_url,
        state_dir=state_dir,
        name=name,
        capacity=capacity,
        ca_file=ca_file,
        environ=environ,
    )

    def run() -> None:
        try:
            agent.run(install_signals=False)
        except Exception:
            log.exception("the embedded agent stopped")

    thread = threading.Thread(target=run, name="embedded-agent", daemon=True)
    thread.start()

    def mark_embedded() -> None:
        # The join happens on the agent's thread; flag the host once it exists.
        for _ in range(100):
            if Host.objects.filter(name=name).update(embedded=True):
                return
            if not thread.is_alive():
                return
            threading.Event().wait(0.1)

    mark_embedded()
    return EmbeddedAgent(agent, thread)
