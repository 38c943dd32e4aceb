"""Isolation for the settings registry: no real zoomies.yaml, no ZOOMIES_* leaking in.

The sealing key (AUTH-07) is isolated too: none from the caller's environment, and a
generated one lands in the test's own data directory, never in the checkout's var/.
"""

from __future__ import annotations

import pytest

from accounts import sealing
from zoomies_site import registry


@pytest.fixture(autouse=True)
def isolated_registry(settings, tmp_path, monkeypatch):
    settings.ZOOMIES_CONFIG_FILE = str(tmp_path / "absent-zoomies.yaml")
    settings.DATA_DIR = tmp_path / "data"
    for setting in registry.SETTINGS.values():
        monkeypatch.delenv(setting.env, raising=False)
        monkeypatch.delenv(f"{setting.env}_FILE", raising=False)
    monkeypatch.delenv(sealing.KEY_ENV, raising=False)
    monkeypatch.delenv(sealing.KEY_FILE_ENV, raising=False)
    sealing.clear_key_cache()
    registry.reload()
    yield
    registry.reload()
    sealing.clear_key_cache()


@pytest.fixture
def defaults():
    return registry.layered(defaults_only=True)
