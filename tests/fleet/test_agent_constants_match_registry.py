"""The agent cannot read the settings registry (it imports nothing of the controller), so
its own constants must equal the registry's defaults, or the two halves disagree."""

from __future__ import annotations

import pytest

from fleet.agent import agent
from zoomies_site import registry


@pytest.mark.parametrize(
    ("constant", "key"),
    [
        ("ORPHAN_GRACE", "agent.orphan_grace"),
        ("MISSING_GRACE", "agent.missing_grace"),
        ("SHUTDOWN_GRACE", "agent.shutdown_grace"),
        ("POLL_WAIT", "agent.long_poll_wait"),
        ("DEFAULT_HEARTBEAT_INTERVAL", "agent.heartbeat_interval"),
    ],
)
def test_agent16_agent17_agent19_the_agent_constants_are_the_registry_defaults(constant, key):
    """AGENT-16, AGENT-17, AGENT-19, HOST-01."""
    default = registry.layered(defaults_only=True)[key]
    assert float(getattr(agent, constant)) == default.total_seconds()
