"""The App client's webhook-delivery calls, over real sockets against the fake GitHub (ARCH-10).

`GitHubApp.hook_deliveries` lists the App webhook's deliveries with the JWT, following the
cursor in the `Link` header within a page bound; `redeliver_hook_delivery` asks for one to
be sent again. Every response is validated against GitHub's schemas (FAKE-03).
"""

from __future__ import annotations

import pytest

from runners.github.errors import GitHubError, NotFound, RateLimited
from runners.github.fake import FakeGitHub
from runners.github.fake.core import REDELIVERY_WINDOW
from tests.runners.github.conftest import MovableClock

LABELS = ["self-hosted", "linux"]
LIST = "/app/hook/deliveries"


def dropped(fake: FakeGitHub, count: int) -> None:
    """`count` deliveries GitHub tried and nobody answered (the fake has no webhook URL)."""
    fake.add_installation("acme", "Organization", ["acme/app"])
    for _ in range(count):
        fake.queue_job(repo="acme/app", labels=LABELS)


def test_arch10_the_deliveries_are_listed_newest_first_with_the_jwt_through_the_cursor(
    app, fake_github, recorder
):
    dropped(fake_github, 250)
    listing = app.hook_deliveries()
    ids = [d["id"] for d in listing.items]
    assert len(ids) == len(set(ids)) == 250 and ids == sorted(ids, reverse=True)
    assert not listing.truncated and listing.charged_calls == 3
    pages = [s for s in recorder.seen if s.path == LIST]
    assert [s.query.get("per_page") for s in pages] == [["100"]] * 3
    assert "cursor" not in pages[0].query and all("cursor" in s.query for s in pages[1:])
    for seen in pages:  # the App's JWT (three dot-separated parts), never a token
        assert seen.request_headers["authorization"].count(".") == 2
    assert not any(p.endswith("/access_tokens") for _, p, _ in fake_github.calls)


def test_arch10_the_listing_stops_at_its_page_bound_or_where_the_caller_says(app, fake_github):
    dropped(fake_github, 250)
    bounded = app.hook_deliveries(max_pages=2)
    assert len(bounded.items) == 200 and bounded.truncated
    first_only = app.hook_deliveries(until=lambda page: True)
    assert len(first_only.items) == 100 and not first_only.truncated


def test_arch10_an_unchanged_list_is_answered_304_and_costs_nothing(app, fake_github):
    dropped(fake_github, 3)
    assert app.hook_deliveries().charged_calls == 1
    again = app.hook_deliveries()
    assert (again.changed, again.charged_calls, len(again.items)) == (False, 0, 3)
    assert app.stats(None).not_modified == 1


def test_arch10_a_redelivery_is_asked_for_and_githubs_refusals_are_errors(
    app, fake_github, fake_github_clock: MovableClock
):
    dropped(fake_github, 1)
    (delivery,) = app.hook_deliveries().items
    assert app.redeliver_hook_delivery(delivery["id"]) is None
    again = fake_github.wait_deliveries(2)[-1]
    assert again["id"] == delivery["guid"] and again["redelivery"] is True
    with pytest.raises(NotFound):
        app.redeliver_hook_delivery(1)
    fake_github_clock.advance(REDELIVERY_WINDOW + 1)
    with pytest.raises(GitHubError) as refused:
        app.redeliver_hook_delivery(delivery["id"])
    assert refused.value.status == 422 and not isinstance(refused.value, RateLimited)


def test_poll06_a_rate_limited_app_gets_githubs_time_as_a_number(
    app, fake_github, fake_github_clock
):
    fake_github.rate_limit_app(reset_in=120)
    with pytest.raises(RateLimited) as limited:
        app.hook_deliveries()
    assert limited.value.retry_at is not None
    assert limited.value.retry_at >= fake_github_clock() + 119
    fake_github.rate_limit_app(reset_in=None, retry_after=30)
    with pytest.raises(RateLimited) as limited:
        app.redeliver_hook_delivery(1)
    assert limited.value.retry_at == pytest.approx(fake_github_clock() + 30, abs=1)
