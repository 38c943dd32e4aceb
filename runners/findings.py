"""What validation says about pools (SEC-04): named warnings for the risky choices.

Pure over objects with `name`, `ephemeral` and `dind`; `live_pool_findings` reads the rows.
The problems list and the controller's startup join these with the settings' findings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError, connection, transaction

from runners.models import Pool
from zoomies_site.core.findings import Finding, warning


def pool_findings(pools: Iterable[Any]) -> list[Finding]:
    out: list[Finding] = []
    for pool in pools:
        name = getattr(pool, "name", str(pool))
        if not getattr(pool, "ephemeral", True):
            out.append(
                warning(
                    f"config.pool_not_ephemeral:{name}",
                    f"Pool {name} is not ephemeral: its runners are reused",
                    "A non-ephemeral runner takes job after job, so one workflow's files, "
                    "credentials and processes could reach the next.",
                    f"Make pool {name} ephemeral.",
                )
            )
        if getattr(pool, "dind", False):
            out.append(
                warning(
                    f"config.pool_docker_exposed:{name}",
                    f"Pool {name} gives its jobs a Docker daemon",
                    "A job that can drive a privileged Docker daemon can escape its container.",
                    f"Turn off Docker-in-Docker for pool {name} unless its jobs need Docker.",
                )
            )
    return out


def live_pool_findings() -> list[Finding]:
    """`pool_findings` over the pool rows; none before the first migrate."""

    def fetch() -> list[Any]:
        return list(Pool.objects.only("name", "ephemeral", "dind").order_by("name"))

    try:
        # Inside a caller's transaction, in a savepoint so a failure cannot poison it.
        if connection.in_atomic_block:
            with transaction.atomic():
                return pool_findings(fetch())
        return pool_findings(fetch())
    except DatabaseError:
        return []  # no table before the first migrate; the settings findings still stand
