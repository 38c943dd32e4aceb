"""Which of the App webhook's failed deliveries to ask GitHub to send again: a pure decision.

GitHub never redelivers a failed delivery by itself. It lists every attempt of the App's
webhook (`GET /app/hook/deliveries`, newest first), and documents the recovery: list the
deliveries since the last run, pick those whose `status` is not "OK" and whose `guid` has no
successful delivery, and ask for each to be redelivered. `plan_redeliveries` is that choice
over a `Snapshot` (the listed deliveries, the guids already asked for, the guids Zoomies
recorded, `now`); every listed delivery gets a decision with its reason, and the plan says
how far the next pass need read back. `runners.redelivery` builds the snapshot, makes the
calls and records them. No Django, no clock, no network here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

OK = "OK"  # GitHub's `status` of a delivery that succeeded (a 2xx answer)
# github.com redelivers the past three days only (its docs once said 30, GHES says 7); a
# delivery older than this is neither asked for nor read back to.
REDELIVERY_WINDOW = timedelta(days=3)
# A delivery is listed once its attempt is over, up to GitHub's 10 s timeout (30 s on GHES)
# after one listed before it began; each pass reads back this far behind the newest it saw,
# so one listed late is still read. Several times the timeout; re-reading costs nothing.
OVERLAP = timedelta(minutes=5)

# What the webhook answers a delivery it cannot read (a missing header, a body that is no
# delivery): decided by the delivery's own bytes, which a redelivery sends unchanged. A 401
# (a secret since rotated) or a 5xx may go through another time; a 400 never will.
REFUSED_AS_MALFORMED = 400

ASK = "ask"
SKIP = "skip"
DEFER = "defer"  # would be asked, but this pass's bound is reached: the next pass asks


@dataclass(frozen=True)
class Delivery:
    """One attempt of a delivery, as GitHub lists it."""

    id: int
    guid: str
    delivered_at: datetime
    redelivery: bool
    status: str
    status_code: int
    event: str
    action: str | None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def describe(self) -> str:
        what = f"{self.event}.{self.action}" if self.action else self.event
        return f"{what} {self.guid} (delivery {self.id})"


@dataclass(frozen=True)
class Snapshot:
    """What one pass decides from. `deliveries` are those listed since `listing_floor`;
    `succeeded` the guids with an OK attempt anywhere in the listing (a success may be
    newer or older than the floor); `asked` the guids a redelivery was asked for already,
    by any pass; `recorded` the guids Zoomies has recorded."""

    now: datetime
    deliveries: tuple[Delivery, ...]
    succeeded: frozenset[str]
    asked: frozenset[str]
    recorded: frozenset[str]
    max_asks: int
    previous_seen_until: datetime | None = None
    window: timedelta = REDELIVERY_WINDOW


@dataclass(frozen=True)
class Decision:
    delivery: Delivery
    verdict: str  # ASK, SKIP or DEFER
    reason: str


@dataclass(frozen=True)
class Plan:
    """A decision for every listed delivery, asks oldest first, and `seen_until`: the point
    the next pass reads back to (less OVERLAP), kept at the oldest deferred ask if any."""

    decisions: tuple[Decision, ...]
    seen_until: datetime | None

    @property
    def asks(self) -> list[Decision]:
        return [d for d in self.decisions if d.verdict == ASK]

    @property
    def deferred(self) -> list[Decision]:
        return [d for d in self.decisions if d.verdict == DEFER]


def parse_delivery(raw: Mapping[str, Any]) -> Delivery | None:
    """A listed item as a Delivery, or None when it lacks what the decision needs."""
    try:
        delivered_at = datetime.fromisoformat(str(raw["delivered_at"]))
        ident, guid, status, code = raw["id"], raw["guid"], raw["status"], raw["status_code"]
    except (KeyError, TypeError, ValueError):
        return None
    if delivered_at.tzinfo is None or not isinstance(ident, int) or isinstance(ident, bool):
        return None
    if not isinstance(guid, str) or not guid or not isinstance(status, str):
        return None
    action = raw.get("action")
    return Delivery(
        id=ident,
        guid=guid,
        delivered_at=delivered_at,
        redelivery=bool(raw.get("redelivery")),
        status=status,
        status_code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
        event=str(raw.get("event") or ""),
        action=action if isinstance(action, str) else None,
    )


def listing_floor(
    seen_until: datetime | None, now: datetime, window: timedelta = REDELIVERY_WINDOW
) -> datetime:
    """How far back a pass reads: the last pass's point less OVERLAP, never past the window
    (the first pass ever reads the whole window)."""
    oldest = now - window
    if seen_until is None:
        return oldest
    return max(seen_until - OVERLAP, oldest)


def plan_redeliveries(snapshot: Snapshot) -> Plan:
    """Decide, for each listed delivery, whether to ask for its redelivery, and why.

    A guid is asked for at most once, through the newest of its failed attempts; never when
    any attempt of it succeeded, when Zoomies recorded it (its answer was late, or a 503
    whose delivery was recorded once the database came back), when a redelivery was asked
    for already, or when it is older than GitHub's window. At most `max_asks` are asked,
    oldest first (the nearest to leaving the window); the rest are deferred.
    """
    oldest_allowed = snapshot.now - snapshot.window
    newest_failure: dict[str, Delivery] = {}
    for delivery in snapshot.deliveries:
        if delivery.ok:
            continue
        kept = newest_failure.get(delivery.guid)
        if kept is None or delivery.id > kept.id:
            newest_failure[delivery.guid] = delivery
    candidates = sorted(
        (
            d
            for d in newest_failure.values()
            if d.guid not in snapshot.succeeded
            and d.guid not in snapshot.recorded
            and d.guid not in snapshot.asked
            and d.delivered_at >= oldest_allowed
        ),
        key=lambda d: (d.delivered_at, d.id),
    )
    asking = {d.id for d in candidates[: max(0, snapshot.max_asks)]}
    decisions = []
    for delivery in sorted(snapshot.deliveries, key=lambda d: (d.delivered_at, d.id)):
        verdict, reason = _decide(delivery, snapshot, newest_failure, asking, oldest_allowed)
        decisions.append(Decision(delivery, verdict, reason))
    return Plan(
        decisions=tuple(decisions),
        seen_until=_seen_until(decisions, snapshot.previous_seen_until),
    )


def _decide(
    delivery: Delivery,
    snapshot: Snapshot,
    newest_failure: Mapping[str, Delivery],
    asking: set[int],
    oldest_allowed: datetime,
) -> tuple[str, str]:
    if delivery.ok:
        return SKIP, f"delivered: GitHub says OK ({delivery.status_code})"
    failed = f"GitHub says {delivery.status!r} ({delivery.status_code})"
    if delivery.status_code == REFUSED_AS_MALFORMED:
        # Issue 29 item 4: the webhook refused these very bytes; the same ones again would be.
        return SKIP, f"{failed}: Zoomies refused it as malformed, and would refuse it again"
    if delivery.guid in snapshot.succeeded:
        return SKIP, f"{failed}, but another attempt of it succeeded"
    if delivery.guid in snapshot.recorded:
        return SKIP, f"{failed}, but Zoomies recorded it (its answer did not reach GitHub)"
    if delivery.guid in snapshot.asked:
        return SKIP, f"{failed}; its redelivery was asked for already, and is asked once"
    if delivery.delivered_at < oldest_allowed:
        return SKIP, f"{failed}, older than GitHub's redelivery window"
    if newest_failure[delivery.guid].id != delivery.id:
        newest = newest_failure[delivery.guid].id
        return SKIP, f"{failed}; a later failed attempt of it (delivery {newest}) is asked for"
    if delivery.id in asking:
        return ASK, f"{failed}, and no attempt of it succeeded nor did Zoomies record it"
    return DEFER, f"{failed}; over this pass's {snapshot.max_asks} redeliveries, the next asks"


def _seen_until(decisions: Iterable[Decision], previous: datetime | None) -> datetime | None:
    decisions = list(decisions)
    deferred = [d.delivery.delivered_at for d in decisions if d.verdict == DEFER]
    if deferred:
        return min(deferred)
    times = [d.delivery.delivered_at for d in decisions]
    if previous is not None:
        times.append(previous)
    return max(times) if times else None


def seen_until_after(plan: Plan, unmade: Iterable[Decision]) -> datetime | None:
    """The plan's `seen_until` when some of its asks were not made (the pass was stopped by
    a rate limit or an unreachable GitHub): kept at the oldest of them, so the next pass
    reads them again."""
    times = [d.delivery.delivered_at for d in unmade]
    if not times:
        return plan.seen_until
    if plan.seen_until is None:
        return min(times)
    return min([plan.seen_until, *times])


def reaches_floor(page: Iterable[Mapping[str, Any]], floor: datetime) -> bool:
    """Whether a listed page (newest first) reaches back past `floor`: no need for more."""
    for raw in page:
        parsed = parse_delivery(raw)
        if parsed is not None and parsed.delivered_at < floor:
            return True
    return False
