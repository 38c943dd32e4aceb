"""Issue 11 item 5: a database that takes no writes is a degraded state that /healthz and
the problems list name, and that ends by itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from zoomies_site.core import dbhealth
from zoomies_site.problems import problems

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = str(tmp_path)
    return tmp_path


@pytest.mark.django_db
def test_store_healthz_says_degraded_with_the_problem_while_writes_fail(client, data_dir):
    assert client.get("/healthz").json() == {"status": "ok"}
    dbhealth.mark_degraded(error="attempt to write a readonly database", now=T0)
    dbhealth.mark_degraded(error="database is locked", now=T0 + timedelta(seconds=10))

    response = client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["since"] == T0.isoformat()  # the first failure, not the latest probe
    (problem,) = body["problems"]
    assert problem["key"] == "database.unwritable"
    assert "database is locked" in problem["detail"]
    assert "database.unwritable" in [p["key"] for p in problems(T0)]

    assert dbhealth.clear() is True
    assert client.get("/healthz").status_code == 200
    assert dbhealth.clear() is False
    assert "database.unwritable" not in [p["key"] for p in problems(T0)]
