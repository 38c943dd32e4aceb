"""Bodies that once earned a 500 from the REST API, or a 200 that changed nothing (issue 21
items 8-10): over real HTTP, as a script would send them."""

from __future__ import annotations

import httpx
import pytest

from runners.naming import runner_image
from tests.runners.test_api import call, tokens  # noqa: F401  # the fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def one_pool(live_server, tokens):  # noqa: F811
    body = {"name": "zoomies-edge", "labels": ["edge"], "backend": "process"}
    answer = call(live_server, "POST", "pools", tokens["write"], json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def raw(live_server, method, path, token, body: bytes):
    return httpx.request(
        method, f"{live_server.url}/api/v1/{path}", content=body, timeout=30,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        b'{"labels": ["ok\\ud800"]}',
        b'{"env": {"A": "\\udfff"}}',
        b'{"host_selector": {"\\ud83d": "x"}}',
    ],
    ids=["label", "env-value", "selector-key"],
)
def test_issue21_item8_a_lone_surrogate_is_refused_and_nothing_is_written(
    live_server,
    tokens,  # noqa: F811
    one_pool,
    body,
):
    answer = raw(live_server, "PATCH", f"pools/{one_pool['id']}", tokens["write"], body)
    assert answer.status_code == 400, answer.text
    assert "lone surrogate" in answer.json()["detail"]
    again = call(live_server, "GET", f"pools/{one_pool['id']}", tokens["read"])
    assert again.status_code == 200 and again.json() == one_pool  # nothing written
    assert call(live_server, "GET", "pools", tokens["read"]).status_code == 200


@pytest.mark.parametrize("method,path", [("POST", "pools"), ("PATCH", "pools/{id}")])
def test_issue21_item9_a_3000_deep_body_is_a_400_not_a_recursion_error(
    live_server,
    tokens,  # noqa: F811
    one_pool,
    method,
    path,
):
    body = b"[" * 3000 + b"]" * 3000
    answer = raw(live_server, method, path.format(id=one_pool["id"]), tokens["write"], body)
    assert answer.status_code == 400, answer.text
    assert "nests deeper than 32 levels" in answer.json()["detail"]


def test_issue21_item10_an_unknown_field_and_an_empty_label_set_are_400s(
    live_server,
    tokens,  # noqa: F811
    one_pool,
):
    pool = f"pools/{one_pool['id']}"
    answer = call(live_server, "PATCH", pool, tokens["write"], json={"maxrunners": 4})
    assert answer.status_code == 400
    assert answer.json()["maxrunners"] == ["this field does not exist here"]
    answer = call(live_server, "PATCH", pool, tokens["write"], json={"labels": []})
    assert answer.status_code == 400 and "at least one label" in answer.json()["labels"][0]
    # The GET shape sent back whole is fine: its read-only fields are ignored.
    answer = call(live_server, "PUT", pool, tokens["write"], json=one_pool)
    assert answer.status_code == 200, answer.text


def test_issue21_item11_the_api_reads_a_body_past_djangos_default_cap(
    live_server,
    tokens,  # noqa: F811
):
    """The README says the API takes bodies up to server.max_request_body (32 MiB, enforced
    by the web server before any route reads them); Django's own 2.5 MiB cap used to refuse
    a 3 MiB body first, with another error shape. Now the body is read and judged."""
    body = {"name": "zoomies-big", "labels": ["big"], "backend": "process",
            "env": {"PADDING": "x" * (3 * 1024 * 1024)}}  # fmt: skip
    answer = call(live_server, "POST", "pools", tokens["write"], json=body)
    assert answer.status_code == 400, answer.text[:200]
    assert "too large" not in answer.text and "env" in answer.json()


def test_issue21_item11_an_empty_backup_name_is_a_sentence_not_a_traceback(tmp_path):
    from django.core.management import CommandError, call_command  # noqa: PLC0415

    with pytest.raises(CommandError, match="name a backup"):
        call_command("backup", "verify", "")
    with pytest.raises(CommandError, match="is a directory, not a backup"):
        call_command("backup", "verify", str(tmp_path))


def test_issue21_item10_a_process_pool_says_which_program_its_runners_run(
    live_server,
    tokens,  # noqa: F811
    one_pool,
):
    """A process pool with no image silently ran the host's /opt/actions-runner/run.sh;
    the pool now says so (and the Pools page shows it), a container pool its image."""
    assert one_pool["runs"] == "/opt/actions-runner/run.sh on the host (actions-runner)"
    body = {"name": "zoomies-box", "labels": ["box"], "backend": "docker"}
    made = call(live_server, "POST", "pools", tokens["write"], json=body).json()
    assert made["runs"] == runner_image("", "", "docker")  # the platform's default image


@pytest.mark.parametrize("path", ["pools/-1", "providers/-36988", "machines/-1/release", "nope"])
def test_a_url_no_api_route_matches_is_a_json_404(live_server, tokens, path):  # noqa: F811
    """A negative id matches no `<int:pk>` route: it was Django's HTML page, outside the
    schema (found by the schema test), where every other API error is `{"detail"}`."""
    answer = call(live_server, "PATCH", path, tokens["write"], json={})
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"detail": "No such resource."}
    page = httpx.get(f"{live_server.url}/no-such-page", timeout=30)
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
