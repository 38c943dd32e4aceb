"""Fuzz: random signed deliveries never earn a 5xx or a traceback (issue 8 acceptance; HOOK-01).

Hypothesis takes GitHub's own example deliveries and replaces fields with hostile values
(ids past 2^63, NaN and 1e300 timestamps, objects where strings go, NUL characters, deep
nesting), or sends bodies that are not deliveries at all, signed with the right secret so
they get past the signature. Each one goes through both routes, runners.webhook_asgi (what
daphne serves) and the Django view (WSGI). Bounded: a fixed number of examples, no
deadline, so the run time does not depend on the machine's load.
"""

from __future__ import annotations

import copy
import json
import logging
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runners.webhooks import sign
from tests.runners.conftest import WEBHOOK_SECRET
from tests.runners.test_webhook_input import post_asgi
from tests.runners.test_webhooks import URL

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "github" / "webhooks"
DELIVERIES = {path.name: json.loads(path.read_text()) for path in sorted(EXAMPLES.glob("*.json"))}
EVENTS = ["workflow_job", "installation", "installation_repositories", "ping", "push", "x" * 80]

# Paths into a delivery that the ingest reads, and one it does not.
PATHS = [
    ("action",),
    ("workflow_job",),
    ("workflow_job", "id"),
    ("workflow_job", "run_id"),
    ("workflow_job", "status"),
    ("workflow_job", "labels"),
    ("workflow_job", "runner_name"),
    ("workflow_job", "conclusion"),
    ("workflow_job", "name"),
    ("workflow_job", "created_at"),
    ("workflow_job", "started_at"),
    ("workflow_job", "completed_at"),
    ("repository",),
    ("repository", "full_name"),
    ("installation",),
    ("installation", "id"),
    ("installation", "account"),
    ("repositories_added",),
    ("repositories_removed",),
    ("sender",),
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e20, float("nan"), float("inf"), 1.5e9]),
    st.text(max_size=30),
    st.sampled_from(
        [
            "", "\x00", "acme/app", "queued", "in_progress", "completed", "waiting",
            "2026-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+14:00",
            "x" * 400, "ä/ö", "self-hosted", "x\ud800", "\udfffacme/app", "\U0001f600",
        ]
    ),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def _set(payload: dict, path: tuple[str, ...], value) -> None:
    node = payload
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def deliveries(draw) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "raw", "deep"]))
    event = draw(st.sampled_from(EVENTS))
    if kind == "raw":
        return event, draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.integers(min_value=500, max_value=50_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return event, (
            '{"action": "queued", "x": ' + opener * depth + "1" + closer * depth + "}"
        ).encode()
    name = draw(st.sampled_from(sorted(DELIVERIES)))
    payload = copy.deepcopy(DELIVERIES[name])
    if name.startswith("workflow_job"):
        event = draw(st.sampled_from(["workflow_job", "workflow_job", event]))
    for path in draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=4, unique=True)):
        _set(payload, path, draw(values))
    return event, json.dumps(payload, allow_nan=True).encode()


def _headers(body: bytes, event: str) -> dict[str, str]:
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body, WEBHOOK_SECRET),
    }


def _no_traceback(caplog) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    caplog.clear()
    assert not bad, [r.getMessage() for r in bad]


FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def signed(github_settings, caplog):
    github_settings.set(webhook_secrets=WEBHOOK_SECRET)
    caplog.set_level(logging.INFO)
    return caplog


@FUZZ
@given(delivery=deliveries())
def test_hook01_fuzz_asgi_route_never_answers_5xx_or_logs_a_traceback(signed, delivery):
    event, body = delivery
    status, answer = post_asgi(body, headers=_headers(body, event))
    assert status < 500, answer
    assert status in (200, 400), (status, answer)
    _no_traceback(signed)


@FUZZ
@given(delivery=deliveries())
def test_hook01_fuzz_django_view_never_answers_5xx_or_logs_a_traceback(signed, client, delivery):
    event, body = delivery
    answer = client.post(
        URL, data=body, content_type="application/json", headers=_headers(body, event)
    )
    assert answer.status_code < 500, answer.content
    assert answer.status_code in (200, 400), answer.content
    _no_traceback(signed)
