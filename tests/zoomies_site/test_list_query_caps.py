"""Every list endpoint of /api/v1/ costs a constant number of queries (no N+1).

The list endpoints come from the URL resolver (every GET route under /api/v1/ with no path
parameter, the agent protocol aside), not from a hand list, so a new one is capped the day it
lands. Each is read with two rows of everything and again with a dozen: the count must not
move, and stays under one cap for all.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from accounts import actions as account_actions
from capacity import actions as capacity_actions
from capacity.planner import Reading
from runners.actions import JobUpdate, record_job
from runners.models import Pool
from tests.fleet.conftest import join, make_runner

pytestmark = pytest.mark.django_db

# One cap for every list: authentication, the registry, the rows and their prefetches. The
# problems list is the heaviest (each of its sources reads its rows; rented machines and
# their providers added two, issue 23 item 7; the jobs whose runner is gone one, issue 21
# item 3; a provider refusing its creates one, issue 24 item 5).
QUERY_CAP = 20
NOW = datetime(2026, 9, 5, 12, 0, tzinfo=UTC)
_serial = count(1)


def _walk(patterns, prefix=""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def list_routes() -> list[str]:
    found = []
    for route, entry in _walk(get_resolver().url_patterns):
        if not route.startswith("api/v1/") or route.startswith("api/v1/agent/") or "<" in route:
            continue
        view = getattr(entry.callback, "cls", None) or getattr(entry.callback, "view_class", None)
        if view is not None and hasattr(view, "get"):
            found.append("/" + route)
    return found


LIST_ROUTES = list_routes()


def seed(rows: int, owner) -> None:
    """`rows` more of everything a list shows, made through the actions where they exist."""
    for _ in range(rows):
        n = next(_serial)
        pool = Pool.objects.create(
            name=f"zoomies-cap-{n}", backend="process", labels=["self-hosted", f"cap-{n}"]
        )
        host, _token = join(f"cap-host-{n}", now=NOW)
        runner = make_runner(host, "idle", now=NOW)
        record_job(
            JobUpdate(
                github_id=900_000 + n,
                status="in_progress",
                repository="acme/app",
                labels=("self-hosted", f"cap-{n}"),
                runner_name=runner.name,
                created_at=NOW,
                started_at=NOW,
            ),
            installation=None,
            now=NOW,
            source="webhook",
            actor="test",
        )
        account_actions.create_api_token(
            user=owner, name=f"cap {n}", scopes=["fleet:read"], actor="test"
        )
        capacity_actions.start_attempt(
            type="capacity.demand",
            reading=Reading(
                pool_id=pool.pk,
                pool_name=pool.name,
                host_selector=(),
                backend="process",
                platform=None,
                required_runner_slots=1,
                current_capacity=0,
                queued_job_count=1,
                oldest_queue_age_seconds=60,
            ),
            reason="a job waits",
            destination_url="http://127.0.0.1:9/capacity",
            now=NOW - timedelta(minutes=n),
        )


def queries(client: APIClient, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code, response.content[:300])
    return len(captured)


def test_the_walk_finds_the_list_endpoints():
    assert {"/api/v1/pools", "/api/v1/runners", "/api/v1/jobs", "/api/v1/hosts"} <= set(LIST_ROUTES)
    assert "/api/v1/tokens" in LIST_ROUTES and "/api/v1/audit" in LIST_ROUTES


@pytest.mark.parametrize("path", LIST_ROUTES)
def test_a_list_endpoint_costs_as_many_queries_for_a_dozen_rows_as_for_two(
    path, admin, token_for, django_assert_max_num_queries
):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for['admin']}")
    seed(2, admin)
    queries(client, path)  # warm: the registry and the token's first use
    few = queries(client, path)
    seed(10, admin)
    with django_assert_max_num_queries(QUERY_CAP) as captured:
        response = client.get(path)
    assert response.status_code == 200
    assert len(captured) == few, (
        f"{path}: {few} queries with two rows, {len(captured)} with a dozen (N+1?)"
    )
