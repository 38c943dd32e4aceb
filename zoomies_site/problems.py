"""The problems list: configuration findings plus what is wrong at runtime (CONF-05, EVT-07).

Computed, never stored: each call works it out from the settings and the rows as they are.
Every entry has a stable key, a severity, a title and a detail sentence.
"""

from __future__ import annotations

from datetime import datetime

from capacity.problems import capacity_problems
from fleet.problems import machine_problems
from runners.findings import live_pool_findings
from runners.models import Runner
from runners.problems import runners_problems
from runners.states import RunnerState
from zoomies_site.core import dbhealth, registry
from zoomies_site.core.controller_lock import lease_lost_since
from zoomies_site.core.findings import Finding


def config_findings(*, fresh: bool = False) -> list[Finding]:
    """The settings' findings and the pools', errors first (CONF-03, CONF-05, SEC-04).

    The problems list reads the process's cached values; `fresh` layers them again first,
    as startup and the system check do.
    """
    if fresh:
        registry.reload()
    found = registry.validate() + live_pool_findings()
    return sorted(found, key=lambda f: not f.is_error)


def not_progressing(now: datetime) -> list[dict]:
    """SCHED-18: runners still not online at half the provision timeout."""
    threshold = registry.get("runners.not_progressing")
    stuck = Runner.objects.filter(
        state__in=[RunnerState.PROVISIONING, RunnerState.REGISTERING],
        created_at__lte=now - threshold,
    ).order_by("created_at")
    names = list(stuck.values_list("name", flat=True)[:20])
    if not names:
        return []
    minutes = int(threshold.total_seconds() // 60)
    return [
        {
            "key": "runners.not_progressing",
            "severity": "warning",
            "title": f"{len(names)} runner(s) not online after {minutes} min",
            "detail": (
                f"{', '.join(names)} have not come online; they will be failed at the provision "
                "timeout. Check the host's agent and the runner's log."
            ),
        }
    ]


def lease_lost() -> list[dict]:
    """LEASE-07: raised once a renewal found another holder, until a controller starts clean."""
    since = lease_lost_since()
    if since is None:
        return []
    return [
        {
            "key": "controller.lease_lost",
            "severity": "error",
            "title": "Another controller took this database's lease",
            "detail": (
                f"Since {since:%Y-%m-%d %H:%M:%S} UTC two controllers may be scheduling over "
                "one database. Stop one of them, then restart the other."
            ),
        }
    ]


def problems(now: datetime) -> list[dict]:
    found = [
        {"key": f.key, "severity": f.severity, "title": f.title, "detail": f"{f.why} {f.fix}"}
        for f in config_findings()
    ]
    found.extend(runners_problems(now))
    found.extend(not_progressing(now))
    found.extend(lease_lost())
    found.extend(dbhealth.problems())
    found.extend(capacity_problems(now))
    found.extend(machine_problems(now))
    return found
