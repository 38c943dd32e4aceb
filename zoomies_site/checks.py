"""The settings registry's findings as a Django system check (CONF-04, CONF-05).

Only error findings are reported here: they are what stops `runserver`, `migrate` and the
controller command. Warnings would be printed by every management command, so they are
left to the startup log and the problems drawer, which read `registry.startup_findings()`.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from zoomies_site import registry


def settings_findings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [
        checks.Error(
            finding.title, hint=f"{finding.why} {finding.fix}", id=f"zoomies.{finding.key}"
        )
        for finding in registry.startup_findings()
        if finding.is_error
    ]
