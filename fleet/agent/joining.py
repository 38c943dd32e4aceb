"""How a new host is told to join: the one line the Hosts page shows, kept beside the
agent's command line it must parse under (a light module: the dashboard imports it, and
it brings none of the backends)."""

from __future__ import annotations

JOIN_TOKEN_ENV = "ZOOMIES_JOIN_TOKEN"  # noqa: S105  # a name or prefix, not a secret
# What the Hosts page puts where the minted join token goes.
JOIN_TOKEN_PLACEHOLDER = "JOIN_TOKEN"  # noqa: S105  # a placeholder, not a secret


def join_command(controller_url: str, token: str = JOIN_TOKEN_PLACEHOLDER) -> str:
    """The line a new host runs to join: the token in the environment, where `ps` does not
    show it (AGENT-21), then the agent's console script with its own flags."""
    return f"{JOIN_TOKEN_ENV}={token} zoomies-agent --controller {controller_url}"
