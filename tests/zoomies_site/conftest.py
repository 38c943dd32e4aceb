"""Isolation for the settings registry: no real zoomies.yaml, no ZOOMIES_* leaking in.

The sealing key (AUTH-07) is isolated too: none from the caller's environment, and a
generated one lands in the test's own data directory, never in the checkout's var/.
"""

from __future__ import annotations

import pytest

from zoomies_site.core import registry


@pytest.fixture(autouse=True)
def isolated_registry(registry_defaults):
    """Every test here starts from the registry's defaults (the root `registry_defaults`)."""
    return registry_defaults


@pytest.fixture
def defaults():
    return registry.layered(defaults_only=True)
