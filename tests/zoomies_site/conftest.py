"""Isolation for the settings registry: no real zoomies.yaml, no ZOOMIES_* leaking in."""

from __future__ import annotations

import pytest

from zoomies_site import registry


@pytest.fixture(autouse=True)
def isolated_registry(settings, tmp_path, monkeypatch):
    settings.ZOOMIES_CONFIG_FILE = str(tmp_path / "absent-zoomies.yaml")
    for setting in registry.SETTINGS.values():
        monkeypatch.delenv(setting.env, raising=False)
        monkeypatch.delenv(f"{setting.env}_FILE", raising=False)
    registry.reload()
    yield
    registry.reload()


@pytest.fixture
def defaults():
    return registry.layered(defaults_only=True)
