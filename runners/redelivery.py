"""The redelivery pass: failed webhook deliveries asked for again from GitHub's side.

GitHub never redelivers a failed delivery by itself: one Zoomies did not answer in time
(the controller was down, or stalled) or answered 503 (its database was busy) stays failed
unless someone asks. `redelivery_step(now)` is GitHub's documented recovery, run every
`github.redelivery_interval` and once when the controller starts:

1. list the App webhook's deliveries (`GET /app/hook/deliveries`, the App's JWT), newest
   first, back to where the last pass got to (less a few minutes for attempts listed
   late), never past GitHub's 3-day redelivery window, at most 10 pages;
2. decide (`runners.redelivery_plan`, pure): a delivery whose status is not OK and whose
   guid has no successful attempt, is not in WebhookDelivery and was never asked for;
3. ask for each (`POST /app/hook/deliveries/{id}/attempts`), at most MAX_ASKS a pass,
   claiming its guid in the database first so it is asked for once, and audit each.

What it spends is bounded: at most 10 list pages and MAX_ASKS asks a pass; each page is
asked for with its last ETag, so an unchanged list costs nothing; nothing is asked once
`github.sweep_budget` of the App's own hourly quota is spent (the poller's `SweepBudget`,
read from the App's rate-limit headers). A rate limit holds the pass until GitHub's time,
by the poller's rule (`runners.poller.standdown_until`, POLL-06/07). The redelivered
deliveries arrive at the webhook and take the webhook's path: deduplicated on the guid
(HOOK-02), a job never moved backwards (HOOK-03). No transaction is held across a call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runners.actions.redeliveries import (
    claim_redelivery,
    hold_redelivery,
    record_redelivery_pass,
    redelivery_state,
    release_redelivery,
    settle_redelivery,
)
from runners.github.client import HOOK_DELIVERY_PAGES
from runners.github.config import get_app
from runners.github.errors import GitHubError, RateLimited, TransportError
from runners.models import RedeliveryRequest, WebhookDelivery
from runners.poller import BudgetSpent, SweepBudget, standdown_until
from runners.redelivery_plan import (
    DEFER,
    REDELIVERY_WINDOW,
    SKIP,
    Decision,
    Snapshot,
    listing_floor,
    parse_delivery,
    plan_redeliveries,
    reaches_floor,
    seen_until_after,
)
from zoomies_site.core import registry

log = logging.getLogger("zoomies.redelivery")

ACTOR = "system:redelivery"
# Asks a pass makes at most. GitHub's secondary limits count content-creating requests (80
# a minute); a backlog larger than this is asked for over the next passes, oldest first.
MAX_ASKS = 50
MAX_PAGES = HOOK_DELIVERY_PAGES  # 1,000 deliveries read back at most, a pass

Clock = Callable[[], float]


@dataclass
class RedeliveryReport:
    """What one pass did: guids asked for, refused by GitHub, deferred to the next pass."""

    enabled: bool = True
    configured: bool = True
    held_until: datetime | None = None
    listed: int = 0
    charged_calls: int = 0
    truncated: bool = False
    asked: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    deferred: list[str] = field(default_factory=list)
    skipped: int = 0
    unparsed: int = 0
    over_budget: str | None = None
    errors: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.enabled:
            return "redelivery: off (github.redelivery_interval is 0)"
        if not self.configured:
            return "redelivery: no GitHub App configured"
        if self.held_until is not None:
            return f"redelivery: held by a rate limit until {self.held_until.isoformat()}"
        return (
            f"redelivery: {self.listed} deliveries read, {len(self.asked)} asked for, "
            f"{len(self.refused)} refused, {len(self.deferred)} deferred"
            + (f", stopped: {self.over_budget}" if self.over_budget else "")
            + (f", errors: {'; '.join(self.errors)}" if self.errors else "")
        )


class _AppQuota:
    """The App's own calls as `SweepBudget` reads an installation's: its stats and clock."""

    def __init__(self, app: Any) -> None:
        self.app = app

    @property
    def stats(self) -> Any:
        return self.app.stats(None)


def redelivery_step(
    now: datetime, *, app: Any = None, clock: Clock | None = None
) -> RedeliveryReport:
    """One redelivery pass (see the module docstring); returns its report.

    `app` is the GitHubApp (default: the configured one); `clock` the clock its
    `RateLimited.retry_at` is measured on, as for the poller's stand-downs.
    """
    report = RedeliveryReport()
    if not registry.get("github.redelivery_interval"):
        report.enabled = False
        return report
    if app is None:
        app = get_app()
    if app is None:
        report.configured = False
        return report
    state = redelivery_state()
    if state.held_until is not None and state.held_until > now:
        report.held_until = state.held_until
        return report
    budget = SweepBudget(_AppQuota(app), registry.get("github.sweep_budget"))
    floor = listing_floor(state.seen_until, now)
    try:
        budget.check()
        listing = app.hook_deliveries(
            until=lambda page: reaches_floor(page, floor), max_pages=MAX_PAGES
        )
    except BudgetSpent as exc:
        report.over_budget = str(exc)
        log.warning("redelivery: %s", exc)
        return report
    except RateLimited as exc:
        report.held_until = _hold(exc, now, clock)
        return report
    except GitHubError as exc:
        report.errors.append(str(exc))
        log.warning("redelivery: listing the App's deliveries failed: %s", exc)
        return report
    report.charged_calls, report.truncated = listing.charged_calls, listing.truncated
    if listing.truncated:
        log.warning(
            "redelivery: %d pages read without reaching %s; older failed deliveries are "
            "left to the safety sweep",
            MAX_PAGES,
            floor.isoformat(),
        )
    plan = plan_redeliveries(_snapshot(listing.items, floor, state.seen_until, now, report))
    unmade = _ask(app, plan.asks, budget, now, clock, report)
    for decision in plan.decisions:
        if decision.verdict == DEFER:
            report.deferred.append(decision.delivery.guid)
        elif decision.verdict == SKIP:
            report.skipped += 1
        log.debug("redelivery: %s: %s: %s", decision.delivery.describe(), decision.verdict,
                  decision.reason)  # fmt: skip
    record_redelivery_pass(
        seen_until=seen_until_after(plan, unmade), now=now, window=REDELIVERY_WINDOW
    )
    if report.asked or report.refused or report.deferred:
        log.info("%s", report)
    return report


def _snapshot(
    items: list[Any],
    floor: datetime,
    seen_until: datetime | None,
    now: datetime,
    report: RedeliveryReport,
) -> Snapshot:
    parsed = []
    for raw in items:
        delivery = parse_delivery(raw) if isinstance(raw, dict) else None
        if delivery is None:
            report.unparsed += 1
        else:
            parsed.append(delivery)
    recent = tuple(d for d in parsed if d.delivered_at >= floor)
    report.listed = len(recent)
    guids = sorted({d.guid for d in recent if not d.ok})
    return Snapshot(
        now=now,
        deliveries=recent,
        succeeded=frozenset(d.guid for d in parsed if d.ok),
        asked=frozenset(
            RedeliveryRequest.objects.filter(guid__in=guids).values_list("guid", flat=True)
        ),
        recorded=frozenset(
            WebhookDelivery.objects.filter(delivery_id__in=guids).values_list(
                "delivery_id", flat=True
            )
        ),
        max_asks=MAX_ASKS,
        previous_seen_until=seen_until,
    )


def _ask(
    app: Any,
    asks: list[Decision],
    budget: SweepBudget,
    now: datetime,
    clock: Clock | None,
    report: RedeliveryReport,
) -> list[Decision]:
    """Ask for each planned redelivery; returns those not asked, for the next pass."""
    for index, decision in enumerate(asks):
        delivery = decision.delivery
        request = claim_redelivery(decision, now=now)
        if request is None:
            continue  # another pass claimed it meanwhile
        try:
            budget.check()
            app.redeliver_hook_delivery(delivery.id)
        except BudgetSpent as exc:
            release_redelivery(request)
            report.over_budget = str(exc)
            log.warning("redelivery: %s", exc)
            return asks[index:]
        except RateLimited as exc:
            release_redelivery(request)
            report.held_until = _hold(exc, now, clock)
            return asks[index:]
        except TransportError as exc:
            release_redelivery(request)
            report.errors.append(str(exc))
            log.warning("redelivery: %s", exc)
            return asks[index:]
        except GitHubError as exc:
            if exc.status is None or exc.status >= 500:  # GitHub's fault: ask again later
                release_redelivery(request)
                report.errors.append(str(exc))
                return asks[index:]
            settle_redelivery(request, asked=False, message=exc.message, now=now, actor=ACTOR)
            report.refused[delivery.guid] = exc.message
            log.warning("redelivery: %s refused: %s", delivery.describe(), exc.message)
            continue
        settle_redelivery(request, asked=True, message="", now=now, actor=ACTOR)
        report.asked.append(delivery.guid)
        log.info("redelivery: asked for %s: %s", delivery.describe(), decision.reason)
    return []


def _hold(exc: RateLimited, now: datetime, clock: Clock | None) -> datetime:
    until = standdown_until(exc, now, clock=clock)
    call = f"{exc.method} {exc.path}" if exc.method and exc.path else "a call"
    reason = f"rate limited by GitHub (redelivery: {call} answered {exc.status})"
    log.warning("redelivery: holding until %s: %s", until.isoformat(), reason)
    return hold_redelivery(until=until, reason=reason, now=now, actor=ACTOR)
