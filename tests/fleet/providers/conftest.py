"""The fake Proxmox cluster the provider's and the onboarding's tests share."""

from __future__ import annotations

import pytest

from tests.fleet.providers import pve


@pytest.fixture
def server():
    """A fake Proxmox over HTTPS, stopped after the test."""
    served = pve.serve()
    yield served
    served.stop()
