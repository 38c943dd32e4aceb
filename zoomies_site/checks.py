"""The settings registry's findings as a Django system check (CONF-04, CONF-05).

Only error findings are reported here: they are what stops `runserver`, `migrate` and the
controller command. Warnings would be printed by every management command, so they are
left to the startup log and the problems drawer (`zoomies_site.problems.config_findings`).
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from zoomies_site.core import registry


def fresh_values() -> registry.Values:
    registry.reload()
    return registry.current()


def settings_findings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [
        checks.Error(
            finding.title, hint=f"{finding.why} {finding.fix}", id=f"zoomies.{finding.key}"
        )
        for finding in registry.validate(fresh_values())
        if finding.is_error
    ]
