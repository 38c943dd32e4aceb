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
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from django.db import DatabaseError, connection
from django.utils import timezone

from fleet.actions import create_join_token
from fleet.agent.cli import build_agent
from fleet.agent.state import AgentState, StateStore
from fleet.models import Host
from runners import naming

log = logging.getLogger("zoomies.controller")

# How long the host row is looked for after the agent starts: its join may wait out a
# database outage, so minutes rather than the seconds a join takes.
MARK_EVERY = 0.2
MARK_TRIES = 1500


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
    store = StateStore(state_dir)
    state = store.load()
    keep_credentials_at(store, state, controller_url)
    if not state.has_credentials_for(controller_url):
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

    threading.Thread(
        target=flag_embedded_host, args=(name, thread.is_alive), name="embedded-agent-flag",
        daemon=True,
    ).start()  # fmt: skip
    return EmbeddedAgent(agent, thread)


def keep_credentials_at(store: StateStore, state: AgentState, controller_url: str) -> bool:
    """Point credentials held for another loopback port at `controller_url`; True if moved.

    The state directory is this controller's own, so what it holds is this controller's
    host, whatever port it was reached on. The internal port is kept across restarts, but a
    killed predecessor's web process can still hold it for a moment, and a new one is then
    chosen: joining again there dropped every runner on the host as if it were new (a busy
    one failed mid-job, and the pool's start backoff counted them)."""
    if state.host_id is None or not state.agent_token or state.has_credentials_for(controller_url):
        return False
    log.info(
        "the embedded agent keeps host %s: its controller moved from %s to %s",
        state.host_id, state.controller_url, controller_url,
    )  # fmt: skip
    state.controller_url = controller_url
    store.save(state)
    return True


def flag_embedded_host(
    name: str,
    agent_alive: Callable[[], bool],
    *,
    tries: int = MARK_TRIES,
    pause: Callable[[float], object] = time.sleep,
) -> bool:
    """Flag the embedded agent's host once its join has made the row; True once done.

    The join happens on the agent's thread, so this looks for the row until it exists or
    the agent stops. Run on a thread of its own and never fatal: the flag is only shown,
    and a write lock another process holds past SQLite's busy timeout must not stop the
    controller at start.
    """
    try:
        for _ in range(tries):
            try:
                if Host.objects.filter(name=name).update(embedded=True):
                    return True
            except DatabaseError as exc:
                log.warning("the embedded agent's host is not flagged yet: %s", exc)
                connection.close()  # a fresh one for the next try
            if not agent_alive():
                return False
            pause(MARK_EVERY)
        log.warning("the embedded agent's host %s was never flagged as embedded", name)
        return False
    finally:
        connection.close()  # this thread's own
