"""Build registry values with every layer supplied by the test."""

from __future__ import annotations

from typing import Any

from zoomies_site.core import registry


def only(
    *,
    env: dict[str, str] | None = None,
    yaml_text: str = "",
    db_values: dict[str, Any] | None = None,
) -> registry.Values:
    """Layered values from exactly the layers given; the ones left out are empty."""
    return registry.layered(env=env or {}, yaml_text=yaml_text, db_values=db_values or {})
