"""What the problems list says about rented machines and their providers (issue 23 item 7).

Worked out from the rows each time: a machine stuck in a passing state for longer than any
of the loop's timeouts, a quarantined machine (only a person can let it go, MACH-08), and an
enabled provider the machine loop last found unreachable (`MachineProvider.down_since`),
and a provider that answers but refuses the creates it is asked for.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from fleet.machines import REFUSED_CREATE
from fleet.models import Machine, MachineProvider
from fleet.states import MachineState as M

# The states a machine only passes through. Each of the loop's own waits is 10 min
# (fleet.machines.Timeouts); past this the loop is not moving it, whatever the reason.
PASSING = (M.PLANNED, M.CREATING, M.STARTING, M.BOOTSTRAPPING, M.ENROLLING, M.DELETING)
STUCK_AFTER = timedelta(minutes=15)
# One entry per machine up to this many of a kind; the rest are counted in one more.
LISTED = 20


def _when(at: datetime, now: datetime) -> str:
    minutes = int((now - at).total_seconds() // 60)
    return f"{at:%Y-%m-%d %H:%M:%S} UTC ({minutes} min ago)"


def _why(machine: Machine) -> str:
    return f" Its last word: {machine.message}" if machine.message else ""


def _listed(entries: list[dict], key: str, what: str) -> list[dict]:
    """The first LISTED entries, and past them one entry counting the rest."""
    if len(entries) <= LISTED:
        return entries
    more = {
        "key": key,
        "severity": "warning",
        "title": f"{len(entries) - LISTED} more machine(s) {what}",
        "detail": "Only the oldest are listed one by one; GET /api/v1/machines has all.",
    }
    return [*entries[:LISTED], more]


def _stuck(m: Machine, now: datetime) -> dict:
    return {
        "key": f"machine.stuck:{m.name}",
        "severity": "warning",
        "title": f"Machine {m.name} has been {m.state} for "
        f"{int((now - m.state_changed_at).total_seconds() // 60)} min",
        "detail": (
            f"{m.name} (provider {m.provider}) has been {m.state} since "
            f"{_when(m.state_changed_at, now)}.{_why(m)} Check the provider and the machine "
            "loop's log."
        ),
    }


def _quarantined(m: Machine, now: datetime) -> dict:
    return {
        "key": f"machine.quarantined:{m.name}",
        "severity": "warning",
        "title": f"Machine {m.name} is quarantined and needs an operator",
        "detail": (
            f"Since {_when(m.state_changed_at, now)} nothing automatic touches {m.name} "
            f"(provider {m.provider}): it could not be proved ours.{_why(m)} Look at it at the "
            "provider, delete it there if it is ours, then release it on the Machines page."
        ),
    }


def machines_needing_a_look(now: datetime) -> list[dict]:
    """Quarantined and stuck machines, oldest first, in one query (every dashboard page
    renders the problems list). Not sliced: machines not deleted are few, bounded by the
    providers' limits, and a slice could hide one kind behind the other."""
    rows = Machine.objects.filter(
        Q(state=M.QUARANTINED) | Q(state__in=PASSING, state_changed_at__lte=now - STUCK_AFTER)
    ).order_by("state_changed_at", "pk")
    held, stuck = [], []
    for m in rows.only("name", "provider", "state", "state_changed_at", "message"):
        if m.state == M.QUARANTINED:
            held.append(_quarantined(m, now))
        else:
            stuck.append(_stuck(m, now))
    minutes = int(STUCK_AFTER.total_seconds() // 60)
    return [
        *_listed(held, "machine.quarantined.more", "quarantined"),
        *_listed(stuck, "machine.stuck.more", f"stuck for over {minutes} min"),
    ]


def providers_down(now: datetime) -> list[dict]:
    down = MachineProvider.objects.filter(enabled=True, down_since__isnull=False).order_by("name")
    return [
        {
            "key": f"provider.down:{p.name}",
            "severity": "error",
            "title": f"Machine provider {p.name} cannot be reached",
            "detail": (
                f"The machine loop has not reached {p.name} ({p.kind}) since "
                f"{_when(p.down_since, now)}: {p.last_error}. No machine is created or deleted "
                "there until it answers."
            ),
        }
        for p in down
    ]


REFUSALS_COUNTED = timedelta(hours=1)


def providers_refusing(now: datetime) -> list[dict]:
    """Issue 24 item 5: a provider that answers but will not create (a template that
    vanished, a cluster with no node that has room, a privilege taken away) keeps failing
    the machines the loop plans; one entry per provider with the count in the last hour and
    the latest reason, since each refused create looks alike on its own."""
    refused = (
        Machine.objects.filter(
            state=M.FAILED,
            state_changed_at__gte=now - REFUSALS_COUNTED,
            message__startswith=REFUSED_CREATE,
        )
        .order_by("-state_changed_at")
        .values_list("provider", "message", "state_changed_at")
    )
    latest: dict[str, tuple[str, datetime]] = {}
    counts: dict[str, int] = {}
    for provider, message, at in refused:
        latest.setdefault(provider, (message.removeprefix(REFUSED_CREATE), at))
        counts[provider] = counts.get(provider, 0) + 1
    return [
        {
            "key": f"provider.refusing:{name}",
            "severity": "error",
            "title": f"Machine provider {name} refuses to create machines",
            "detail": (
                f"{counts[name]} create(s) refused in the last hour, the latest at "
                f"{_when(at, now)}: {why}. The loop plans again each round; fix it at the "
                "provider (its template, its room, the token's privileges) or disable it."
            ),
        }
        for name, (why, at) in sorted(latest.items())
    ]


def machine_problems(now: datetime) -> list[dict]:
    return [*providers_down(now), *providers_refusing(now), *machines_needing_a_look(now)]
