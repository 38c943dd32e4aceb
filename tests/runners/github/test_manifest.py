"""ARCH-11, the GitHub App manifest flow, against the fake GitHub over real HTTP: the fake's
new-App page turns a posted manifest into a code and sends the browser back with it and the
state; the conversion trades the code once, within the hour, for the App as GitHub's schema
describes it; the production client (runners/github/manifest.py) reads it."""

from __future__ import annotations

import json
import urllib.parse

import httpx
import pytest

from runners.github import manifest
from tests.runners.github.conftest import Recorded

PUBLIC = "https://zoomies.example:8443"


def post_manifest(fake, *, state: str = "s-1", organization: str = "", body=None):
    """What the admin's browser does with the Settings page's form, not following GitHub's
    redirect: the answer's Location is where the browser would go next."""
    url = manifest.new_app_url(fake.url, state=state, organization=organization)
    document = body if body is not None else manifest.manifest_json(name="Zoomies runners",
                                                                    public_url=PUBLIC)  # fmt: skip
    return httpx.post(url, data={"manifest": document}, follow_redirects=False, timeout=10)


def code_and_state(answer: httpx.Response) -> tuple[str, str]:
    assert answer.status_code == 302, answer.text
    location = urllib.parse.urlsplit(answer.headers["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == (
        f"{PUBLIC}/settings/github-app/created"
    )
    query = urllib.parse.parse_qs(location.query)
    return query["code"][0], query["state"][0]


def test_arch11_the_manifest_asks_for_what_zoomies_needs_and_names_this_controller():
    made = manifest.manifest(name="Zoomies runners for a very long organisation", public_url=PUBLIC)
    assert len(made["name"]) <= manifest.MAX_NAME
    assert made["hook_attributes"] == {"url": f"{PUBLIC}/webhooks/github", "active": True}
    assert made["redirect_url"] == f"{PUBLIC}/settings/github-app/created"
    assert made["default_events"] == ["workflow_job"] and made["public"] is False
    assert made["default_permissions"]["administration"] == "write"
    assert made["default_permissions"]["organization_self_hosted_runners"] == "write"
    assert manifest.web_base("https://api.github.com") == "https://github.com"
    assert manifest.web_base("https://ghe.example/api/v3") == "https://ghe.example"
    assert manifest.new_app_url("https://api.github.com", state="a b", organization="acme") == (
        "https://github.com/organizations/acme/settings/apps/new?state=a%20b"
    )


def test_arch11_a_code_becomes_the_app_once_as_githubs_schema_says(fake_github, github_schemas):
    code, state = code_and_state(post_manifest(fake_github, state="s-42"))
    assert state == "s-42"
    raw = httpx.post(f"{fake_github.url}/app-manifests/{code}/conversions", timeout=10)
    github_schemas.validate_response(Recorded(
        "POST", f"/app-manifests/{code}/conversions", raw.status_code, dict(raw.headers),
        raw.json(),
    ))  # fmt: skip
    assert raw.status_code == 201
    # The fake now delivers to the manifest's hook, signed with the secret it handed out.
    assert fake_github.webhook_url == f"{PUBLIC}/webhooks/github"
    assert raw.json()["webhook_secret"] == fake_github.webhook_secret
    with pytest.raises(manifest.ConversionFailed, match="404"):
        manifest.convert(fake_github.url, code)  # a code works once


def test_arch11_the_production_client_reads_the_app_and_a_stale_code_is_refused(
    fake_github, fake_github_clock
):
    code, _ = code_and_state(post_manifest(fake_github, organization="acme"))
    app = manifest.convert(fake_github.url, code)
    assert app.app_id == fake_github.app_id and app.pem == fake_github.private_key_pem
    assert app.slug == "zoomies-runners" and app.webhook_secret == fake_github.webhook_secret
    assert app.install_url == f"{fake_github.url}/apps/zoomies-runners/installations/new"
    late, _ = code_and_state(post_manifest(fake_github))
    fake_github_clock.advance(3601)
    with pytest.raises(manifest.ConversionFailed, match="an hour"):
        manifest.convert(fake_github.url, late)


@pytest.mark.parametrize(
    "body", ["not json", json.dumps({"name": "x"}), json.dumps({**manifest.manifest(
        name="x", public_url=PUBLIC), "hook_attributes": {}})],
)  # fmt: skip
def test_arch11_the_fakes_page_refuses_a_manifest_github_would_refuse(fake_github, body):
    answer = post_manifest(fake_github, body=body)
    assert answer.status_code == 422 and "manifest" in answer.json()["message"]
