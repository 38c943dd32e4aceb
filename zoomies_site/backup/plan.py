"""The scheduled backups' decisions, pure: is a copy due, and which copies retention removes.

No Django, no clock, no files: a snapshot in, a plan with a reason per action out,
so tests choose `now` and read why each copy was made or removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Copy:
    """One backup as retention sees it: its name and when it was taken."""

    name: str
    created_at: datetime


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    interval: timedelta  # 0 means scheduled copies are off
    keep: int  # the newest this many are kept
    keep_days: int  # and none older than this many days, 0 for no age limit
    copies: tuple[Copy, ...]


@dataclass(frozen=True)
class Prune:
    name: str
    reason: str


@dataclass(frozen=True)
class Plan:
    take: bool
    why: str
    prune: tuple[Prune, ...]


def retention(snapshot: Snapshot) -> tuple[Prune, ...]:
    """The copies outside the newest `keep`, or older than `keep_days`; never the newest one,
    so a long outage of the schedule never leaves nothing to restore."""
    ordered = sorted(snapshot.copies, key=lambda c: (c.created_at, c.name), reverse=True)
    limit = snapshot.now - timedelta(days=snapshot.keep_days) if snapshot.keep_days else None
    pruned = []
    for position, copy in enumerate(ordered):
        if position == 0:
            continue
        if position >= snapshot.keep:
            pruned.append(Prune(copy.name, f"beyond the newest {snapshot.keep} copies"))
        elif limit is not None and copy.created_at < limit:
            pruned.append(Prune(copy.name, f"older than {snapshot.keep_days} days"))
    return tuple(pruned)


def decide(snapshot: Snapshot) -> Plan:
    """Whether a scheduled copy is due now (from the newest copy's age, so a restart of the
    controller neither skips nor repeats one), and what retention removes afterwards."""
    if snapshot.interval <= timedelta(0):
        return Plan(False, "scheduled backups are off (backup.interval is 0s)", ())
    newest = max((c.created_at for c in snapshot.copies), default=None)
    if newest is None:
        return Plan(True, "there is no backup yet", retention(snapshot))
    age = snapshot.now - newest
    if age >= snapshot.interval:
        return Plan(
            True, f"the newest backup is {age} old, over {snapshot.interval}", retention(snapshot)
        )
    return Plan(
        False, f"the newest backup is {age} old, under {snapshot.interval}", retention(snapshot)
    )
