"""The pure redelivery decision: which failed deliveries to ask GitHub for again, and why.

GitHub's documented recovery: deliveries whose `status` is not OK and whose `guid` has no
successful delivery are asked for again. Every listed delivery gets a reason; a guid is
asked for once; the pass's bound defers the rest, and the plan says how far back the next
pass reads. No database, no clock, no network: the module is checked to import none.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from runners import redelivery_plan as rp
from runners.redelivery_plan import (
    ASK,
    DEFER,
    OVERLAP,
    REDELIVERY_WINDOW,
    SKIP,
    Delivery,
    Snapshot,
    listing_floor,
    parse_delivery,
    plan_redeliveries,
    reaches_floor,
    seen_until_after,
)
from tests.purity import impurities

NOW = datetime(2026, 9, 5, 12, 0, tzinfo=UTC)
# GitHub's own example items (`hook-delivery-items` in its OpenAPI description).
GITHUB_EXAMPLE = [
    {
        "id": 12345678,
        "guid": "0b989ba4-242f-11e5-81e1-c7b6966d2516",
        "delivered_at": "2019-06-03T00:57:16Z",
        "redelivery": False,
        "duration": 0.27,
        "status": "OK",
        "status_code": 200,
        "event": "issues",
        "action": "opened",
        "installation_id": 123,
        "repository_id": 456,
        "throttled_at": "2019-06-03T00:57:16Z",
    },
    {
        "id": 123456789,
        "guid": "0b989ba4-242f-11e5-81e1-c7b6966d2516",
        "delivered_at": "2019-06-04T00:57:16Z",
        "redelivery": True,
        "duration": 0.28,
        "status": "OK",
        "status_code": 200,
        "event": "issues",
        "action": "opened",
        "installation_id": 123,
        "repository_id": 456,
        "throttled_at": None,
    },
]


def delivery(
    ident: int,
    guid: str,
    *,
    ago: timedelta = timedelta(minutes=1),
    status: str = "timed out",
    code: int = 0,
    redelivery: bool = False,
) -> Delivery:
    return Delivery(
        id=ident,
        guid=guid,
        delivered_at=NOW - ago,
        redelivery=redelivery,
        status=status,
        status_code=code,
        event="workflow_job",
        action="queued",
    )


def ok(ident: int, guid: str, **kw) -> Delivery:
    return delivery(ident, guid, status="OK", code=200, **kw)


def snapshot(*deliveries: Delivery, max_asks: int = 50, **kw) -> Snapshot:
    return Snapshot(
        now=NOW,
        deliveries=tuple(deliveries),
        succeeded=kw.pop("succeeded", frozenset(d.guid for d in deliveries if d.ok)),
        asked=kw.pop("asked", frozenset()),
        recorded=kw.pop("recorded", frozenset()),
        max_asks=max_asks,
        **kw,
    )


def verdicts(plan) -> dict[int, tuple[str, str]]:
    return {d.delivery.id: (d.verdict, d.reason) for d in plan.decisions}


def test_the_decision_module_imports_nothing_but_the_standard_librarys_pure_parts():
    allowed = {"__future__", "collections.abc", "dataclasses", "datetime", "typing"}
    assert impurities(Path(rp.__file__), allowed) == []


def test_a_failed_delivery_with_no_success_is_asked_for_and_says_why():
    plan = plan_redeliveries(snapshot(delivery(1, "a", status="Invalid HTTP Response: 503",
                                               code=503)))  # fmt: skip
    (decision,) = plan.decisions
    assert decision.verdict == ASK
    assert decision.reason == (
        "GitHub says 'Invalid HTTP Response: 503' (503), and no attempt of it succeeded nor "
        "did Zoomies record it"
    )


def test_every_listed_delivery_gets_a_reason_and_only_the_unrecovered_are_asked_for():
    plan = plan_redeliveries(
        snapshot(
            ok(1, "delivered"),
            delivery(2, "redelivered"),
            ok(3, "redelivered", redelivery=True),
            delivery(4, "recorded"),
            delivery(5, "asked"),
            delivery(6, "stale", ago=REDELIVERY_WINDOW + timedelta(minutes=1)),
            delivery(7, "lost"),
            recorded=frozenset({"recorded"}),
            asked=frozenset({"asked"}),
        )
    )
    got = verdicts(plan)
    assert got[1] == (SKIP, "delivered: GitHub says OK (200)")
    assert got[2] == (SKIP, "GitHub says 'timed out' (0), but another attempt of it succeeded")
    assert got[3][0] == SKIP
    assert got[4] == (
        SKIP,
        "GitHub says 'timed out' (0), but Zoomies recorded it (its answer did not reach GitHub)",
    )
    assert got[5] == (
        SKIP,
        "GitHub says 'timed out' (0); its redelivery was asked for already, and is asked once",
    )
    assert got[6] == (SKIP, "GitHub says 'timed out' (0), older than GitHub's redelivery window")
    assert got[7][0] == ASK
    assert [d.delivery.guid for d in plan.asks] == ["lost"]


def test_a_guid_that_failed_twice_is_asked_for_once_through_its_newest_attempt():
    plan = plan_redeliveries(
        snapshot(delivery(10, "g", ago=timedelta(minutes=9)), delivery(20, "g", redelivery=True))
    )
    assert [d.delivery.id for d in plan.asks] == [20]
    assert verdicts(plan)[10] == (
        SKIP,
        "GitHub says 'timed out' (0); a later failed attempt of it (delivery 20) is asked for",
    )


def test_a_success_outside_the_pass_still_counts_for_its_guid():
    """The success may sit below the listing floor: the snapshot's `succeeded` holds it."""
    plan = plan_redeliveries(snapshot(delivery(1, "g"), succeeded=frozenset({"g"})))
    assert plan.asks == []


def test_the_bound_asks_the_oldest_and_defers_the_rest_to_the_next_pass():
    failures = [delivery(i, f"g{i}", ago=timedelta(minutes=10 - i)) for i in range(1, 5)]
    plan = plan_redeliveries(snapshot(*reversed(failures), max_asks=2))
    assert [d.delivery.id for d in plan.asks] == [1, 2]
    assert [d.delivery.id for d in plan.deferred] == [3, 4]
    assert verdicts(plan)[3] == (
        DEFER,
        "GitHub says 'timed out' (0); over this pass's 2 redeliveries, the next asks",
    )
    # The next pass reads back far enough to meet the deferred ones again.
    assert plan.seen_until == failures[2].delivered_at
    assert listing_floor(plan.seen_until, NOW) <= failures[2].delivered_at


def test_the_next_pass_reads_back_to_the_newest_delivery_less_the_overlap():
    plan = plan_redeliveries(snapshot(ok(1, "a", ago=timedelta(minutes=3)), delivery(2, "b")))
    assert plan.seen_until == NOW - timedelta(minutes=1)
    assert listing_floor(plan.seen_until, NOW) == NOW - timedelta(minutes=1) - OVERLAP
    quiet = plan_redeliveries(snapshot(previous_seen_until=NOW - timedelta(hours=1)))
    assert quiet.seen_until == NOW - timedelta(hours=1)
    assert plan_redeliveries(snapshot()).seen_until is None


def test_asks_not_made_keep_the_reading_point_at_the_oldest_of_them():
    failures = [delivery(i, f"g{i}", ago=timedelta(minutes=10 - i)) for i in range(1, 4)]
    plan = plan_redeliveries(snapshot(*failures))
    assert plan.seen_until == failures[2].delivered_at
    assert seen_until_after(plan, plan.asks[1:]) == failures[1].delivered_at
    assert seen_until_after(plan, []) == plan.seen_until


def test_the_first_pass_reads_the_whole_window_and_later_ones_never_past_it():
    assert listing_floor(None, NOW) == NOW - REDELIVERY_WINDOW
    assert listing_floor(NOW - timedelta(days=9), NOW) == NOW - REDELIVERY_WINDOW
    assert listing_floor(NOW - timedelta(hours=1), NOW) == NOW - timedelta(hours=1) - OVERLAP


def test_githubs_example_items_parse_and_a_broken_one_does_not():
    first, second = (parse_delivery(item) for item in GITHUB_EXAMPLE)
    assert first is not None and second is not None
    assert first.ok and first.delivered_at == datetime(2019, 6, 3, 0, 57, 16, tzinfo=UTC)
    assert second.redelivery and second.guid == first.guid
    assert parse_delivery({**GITHUB_EXAMPLE[0], "delivered_at": "yesterday"}) is None
    assert parse_delivery({**GITHUB_EXAMPLE[0], "delivered_at": "2019-06-03T00:57:16"}) is None
    assert parse_delivery({**GITHUB_EXAMPLE[0], "id": "12345678"}) is None
    assert parse_delivery({"id": 1}) is None


def test_a_page_reaches_the_floor_when_it_holds_a_delivery_older_than_it():
    floor = datetime(2019, 6, 3, 12, 0, tzinfo=UTC)
    assert reaches_floor(GITHUB_EXAMPLE, floor)
    assert not reaches_floor(GITHUB_EXAMPLE[1:], floor)
    assert not reaches_floor([], floor)
