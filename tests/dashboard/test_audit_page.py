"""The dashboard's Audit page (issue 10 items 5 and 8): filtered by actor, action, object
type, object id and time, with the API's own filters, so the page and GET /api/v1/audit
show the same rows for the same query."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.test import Client

from runners.actions import pools as pool_actions
from tests.accounts.conftest import client_for

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
OBJECT_CELL = re.compile(r'<td data-label="Object">([^<]*)</td>')


@pytest.fixture
def pools():
    """Three pools made an hour apart by two people: pool.create rows at 12:00, 13:00, 14:00."""
    return [
        pool_actions.create_pool(
            {"name": f"zoomies-{n}", "backend": "process"}, actor=actor, now=T0 + timedelta(hours=i)
        )
        for i, (n, actor) in enumerate([("a", "user:ada"), ("b", "user:otto"), ("c", "user:ada")])
    ]


@pytest.fixture
def page(cast):
    client = Client()
    client.force_login(cast["viewer"])
    api = client_for(cast["viewer"])

    def shown(**query) -> tuple[list[str], str]:
        """The page's objects for `query`, checked against the API's for the same query."""
        html = client.get(f"/audit?{urlencode(query)}").content.decode()
        objects = OBJECT_CELL.findall(html)
        answer = api.get("/api/v1/audit", query)
        if answer.status_code == 200:
            rows = answer.json()["results"]
            assert objects == [f"{r['target_type']}:{r['target_id']}" for r in rows], query
        return objects, html

    return shown


def test_the_audit_page_filters_by_object_id(pools, page):
    a, b, _c = pools
    objects, html = page(target_type="pool", target_id=str(b.pk))
    assert objects == [f"pool:{b.pk}"]
    assert f'name="target_id" value="{b.pk}"' in html  # the form keeps what was asked
    objects, _html = page(target_id=str(a.pk), actor="otto")
    assert objects == []


def test_the_audit_page_filters_by_time_since_inclusive_until_exclusive(pools, page):
    _a, b, c = pools
    objects, html = page(target_type="pool", since="2026-11-01T12:30Z", until="2026-11-01T14:00Z")
    assert objects == [f"pool:{b.pk}"]
    assert 'name="since" value="2026-11-01T12:30Z"' in html
    # Without an offset a time is UTC, the zone the page shows; newest first.
    objects, _html = page(target_type="pool", since="2026-11-01T13:00")
    assert objects == [f"pool:{c.pk}", f"pool:{b.pk}"]
    objects, _html = page(action="pool.", actor="ada", until="2026-11-01T13:00Z")
    assert objects == [f"pool:{pools[0].pk}"]


def test_a_time_that_is_not_one_is_said_and_shows_nothing(pools, page, cast):
    objects, html = page(since="yesterday")
    assert objects == [] and 'role="alert"' in html and "since:" in html
    assert (
        client_for(cast["viewer"]).get("/api/v1/audit", {"since": "yesterday"}).status_code == 400
    )


def test_people_come_first_the_controllers_own_rows_behind_the_who_filter(pools, cast):
    """Issue 21 item 15: after half an hour the log is mostly the controller's own rows;
    the page shows people and their tokens unless asked for the controller's or agents'."""
    from accounts import audit  # noqa: PLC0415

    audit.record(actor="system:reconcile", action="runner.created", detail={"pool": "a"})
    audit.record(actor="agent:box-1", action="runner.reported", detail={"state": "idle"})
    client = Client()
    client.force_login(cast["viewer"])

    def actors(query: str) -> list[str]:
        html = client.get(f"/audit{query}").content.decode()
        return re.findall(r'<td data-label="Actor">([^<]*)</td>', html)

    people = actors("")
    assert {"user:ada", "user:otto"} <= set(people)
    assert not {"system:reconcile", "agent:box-1"} & set(people)
    assert actors("?who=controller") == ["system:reconcile"]
    assert actors("?who=agents") == ["agent:box-1"]
    assert sorted(actors("?who=all")) == sorted([*people, "system:reconcile", "agent:box-1"])
    api = client_for(cast["viewer"])
    everyone = api.get("/api/v1/audit").json()["results"]  # the API's default: all
    assert len(everyone) == len(people) + 2
    rows = api.get("/api/v1/audit", {"who": "controller"}).json()["results"]
    assert [r["actor"] for r in rows] == ["system:reconcile"]
    assert api.get("/api/v1/audit", {"who": "robots"}).status_code == 400


def test_details_are_shown_as_fields_not_as_python_text(cast):
    from accounts import audit  # noqa: PLC0415

    audit.record(
        actor="user:ada", action="pool.update", detail={"name": "a", "changed": {"max": [2, 4]}}
    )
    client = Client()
    client.force_login(cast["viewer"])
    html = client.get("/audit").content.decode()
    assert "<dt>name</dt><dd>a</dd>" in html
    assert "<dt>changed</dt><dd>{&quot;max&quot;: [2, 4]}</dd>" in html
    assert "{&#x27;name&#x27;" not in html  # no dict repr
