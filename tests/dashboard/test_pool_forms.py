"""The dashboard's pool forms (issue 10 items 6 and 8): operators and admins create and edit
pools; the form is judged by the API's own validation, in the API's words, and saved by the
pool actions with one audit row each."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.utils.html import escape

from accounts.models import AuditLog
from fleet.models import Host
from runners.models import Pool
from runners.naming import validate_pool_name
from tests.accounts.conftest import client_for
from zoomies_site.dashboard_pools import body_from_form

pytestmark = pytest.mark.django_db
FORM = {
    "name": "zoomies-small", "labels": "self-hosted, linux", "backend": "process",
    "image": "", "platform": "", "installation": "", "repository": "",
    "host_selector": "zone=b", "cpus": "", "memory_mb": "", "warm": "1",
    "max_runners": "4", "idle_timeout": "00:30:00", "runner_group_id": "1",
}  # fmt: skip


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_operator_creates_a_pool_from_the_form_with_one_audit_row(cast):
    page = signed_in(cast["operator"])
    answer = page.post("/pools/new", FORM)
    assert answer.status_code == 302 and answer["Location"] == "/pools?saved=zoomies-small"
    pool = Pool.objects.get(name="zoomies-small")
    assert pool.labels == ["self-hosted", "linux"]
    assert pool.host_selector == {"zone": "b"}
    assert (pool.warm, pool.max_runners, pool.dind) == (1, 4, False)
    assert pool.idle_timeout.total_seconds() == 1800
    rows = AuditLog.objects.filter(action="pool.create", target_id=str(pool.pk))
    assert [r.actor for r in rows] == ["user:otto"]
    assert "Pool zoomies-small saved." in page.get(answer["Location"]).content.decode()


@pytest.mark.parametrize(
    "change",
    [
        {"warm": "5", "max_runners": "2"},
        {"labels": "self-hosted, a\tb"},
        {"name": "Bad Name!"},
        {"backend": "process", "image": "/bin/sh"},
        {"cpus": "-1"},
        {"host_selector": "zone"},
    ],
)
def test_a_bad_pool_is_refused_with_the_apis_own_sentences_and_nothing_is_written(cast, change):
    form = {**FORM, **change}
    page = signed_in(cast["operator"]).post("/pools/new", form)
    assert page.status_code == 200
    text = page.content.decode()
    assert "The pool was not saved" in text
    # The same body through the API: refused with the same sentences.
    api = client_for(cast["operator"]).post("/api/v1/pools", body_from_form(form), format="json")
    assert api.status_code == 400
    sentences = [m for field, ms in api.json().items() if field != "detail" for m in ms]
    assert sentences
    for sentence in sentences:
        assert escape(sentence) in text
    assert not Pool.objects.filter(name=form["name"]).exists()
    assert not AuditLog.objects.filter(action="pool.create").exists()


def test_an_admin_edits_a_pool_and_the_audit_row_holds_before_and_after(cast):
    admin = signed_in(cast["admin"])
    admin.post("/pools/new", FORM)
    pool = Pool.objects.get(name="zoomies-small")
    form = admin.get(f"/pools/{pool.pk}/edit").content.decode()
    assert 'value="self-hosted, linux"' in form and 'value="zone=b"' in form
    answer = admin.post(f"/pools/{pool.pk}/edit", {**FORM, "max_runners": "8"})
    assert answer.status_code == 302
    pool.refresh_from_db()
    assert pool.max_runners == 8
    row = AuditLog.objects.get(action="pool.update", target_id=str(pool.pk))
    assert row.actor == "user:ada"
    assert row.detail["before"]["max_runners"] == 4 and row.detail["after"]["max_runners"] == 8


def test_a_viewer_may_not_open_or_post_the_pool_forms(cast):
    viewer = signed_in(cast["viewer"])
    assert viewer.get("/pools/new").status_code == 403
    assert viewer.post("/pools/new", FORM).status_code == 403
    assert not Pool.objects.exists()
    assert Client().get("/pools/new").status_code == 302  # to sign in
    assert 'id="new-pool"' not in viewer.get("/pools").content.decode()


def test_issue21_item14_every_error_comes_on_the_first_submit(cast):
    """Issue 21 item 14: a bad number kept the pool's own validation from running, so the
    form said two things on the first submit and five more on the second. Now one submit
    names every field the second would have."""
    form = {**FORM, "cpus": "lots", "name": "Bad Name!", "labels": "a\tb", "host_selector": "zone"}
    text = signed_in(cast["operator"]).post("/pools/new", form).content.decode()
    for field in ("cpus", "name", "labels", "host_selector"):
        assert f"<code>{field}</code>:" in text, field
    # Fixing the number alone leaves exactly the rest: nothing new appears on a resubmit.
    fixed = signed_in(cast["operator"]).post("/pools/new", {**form, "cpus": ""})
    named = {f for f in FORM if f"<code>{f}</code>:" in fixed.content.decode()}
    assert named == {"name", "labels", "host_selector"}
    assert not Pool.objects.exists()


def test_issue21_item14_a_new_pools_form_offers_what_the_hosts_offer_and_a_valid_name(cast):
    """The placeholder name is one the validation accepts, and the preselected backend is
    one a healthy host offers (docker was preselected with only process hosts)."""
    page = signed_in(cast["operator"])
    text = page.get("/pools/new").content.decode()
    placeholder = re.search(r'name="name"[^>]*placeholder="([^"]+)"', text).group(1)
    validate_pool_name(placeholder)
    assert re.search(r'<option value="process" selected>', text)  # no hosts: process
    Host.objects.create(name="zoomies-h1", backends=["podman"], health="healthy", capacity=2)
    text = page.get("/pools/new").content.decode()
    assert re.search(r'<option value="podman" selected>', text)
