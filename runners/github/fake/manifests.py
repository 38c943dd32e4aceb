"""The fake GitHub's App manifest flow (ARCH-11): the web page a browser posts a manifest to
(`/settings/apps/new`, or an organization's), which "creates" the App and sends the browser
to the manifest's redirect_url with a code and the state, and the REST conversion that
trades the code, once and within the hour, for the App's id, private key and webhook secret
(`POST /app-manifests/{code}/conversions`, no authentication, 201).

The App made is this fake's own (its id and key), so what the controller stores is what the
fake signs JWTs against; from the conversion on, deliveries go to the manifest's hook URL,
signed with the webhook secret the conversion handed out.
"""

from __future__ import annotations

import json
import secrets
import urllib.parse
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.core import HttpError, Request, Response
from runners.github.fake.shapes import iso
from runners.github.fake.state import FakeState

CODE_LIFETIME = 3600.0  # GitHub: "You must use this code within one hour"
REQUIRED = ("name", "url", "hook_attributes", "redirect_url")


def new_app_page(state: FakeState, req: Request) -> Response:
    """`/settings/apps/new` (the browser's half): the App "created", the browser sent back."""
    form = urllib.parse.parse_qs(req.raw_body.decode("utf-8", "replace"))
    try:
        manifest = json.loads((form.get("manifest") or [""])[-1])
    except ValueError:
        raise HttpError(422, "Invalid manifest: not JSON") from None
    missing = [k for k in REQUIRED if not isinstance(manifest, dict) or not manifest.get(k)]
    hook = manifest.get("hook_attributes") if isinstance(manifest, dict) else None
    if missing or not isinstance(hook, dict) or not hook.get("url"):
        raise HttpError(422, f"Invalid manifest: missing {', '.join(missing) or 'hook url'}")
    code = secrets.token_hex(10)
    state.manifest_codes[code] = {
        "manifest": manifest,
        "at": state.clock(),
        "organization": req.params.get("org", ""),
    }
    query = {"code": code}
    if req.q("state") is not None:
        query["state"] = req.q("state") or ""
    target = manifest["redirect_url"]
    joiner = "&" if "?" in target else "?"
    return Response(302, None, {"Location": f"{target}{joiner}{urllib.parse.urlencode(query)}"})


def convert_manifest(state: FakeState, req: Request) -> Response:
    """The code's conversion, once and within the hour."""
    made = state.manifest_codes.pop(req.params["code"], None)
    if made is None or state.clock() - made["at"] > CODE_LIFETIME:
        raise HttpError(404, "Not Found")
    manifest: dict[str, Any] = made["manifest"]
    state.webhook_url = manifest["hook_attributes"]["url"]
    state.webhook_secret = secrets.token_hex(20)
    state.app_slug = _slug(manifest["name"])
    state.app_permissions = dict(manifest.get("default_permissions") or {})
    state.app_events = list(manifest.get("default_events") or [])
    login = made["organization"] or "zoomies-dev"
    body = {
        "id": state.app_id,
        "slug": state.app_slug,
        "node_id": shapes.node_id("Integration", state.app_id),
        "owner": shapes.simple_user(state.url, state.url, login, 7_000_001),
        "name": manifest["name"],
        "description": manifest.get("description") or "",
        "external_url": manifest["url"],
        "html_url": f"{state.url}/apps/{state.app_slug}",
        "created_at": iso(state.clock()),
        "updated_at": iso(state.clock()),
        "permissions": state.app_permissions,
        "events": state.app_events,
        "client_id": state.client_id,
        "client_secret": secrets.token_hex(20),
        "webhook_secret": state.webhook_secret,
        "pem": state.private_key_pem,
    }
    return Response(201, body)


def _slug(name: str) -> str:
    cleaned = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return "-".join(part for part in cleaned.split("-") if part) or "app"
