"""The GitHub App manifest flow (ARCH-11, issue 26 item 2): the operator is sent to GitHub
with a manifest saying what Zoomies needs, GitHub sends them back with a one-hour code, and
the code is traded (`POST /app-manifests/{code}/conversions`, no authentication) for the
App's id, private key and webhook secret. No secret is typed by hand.

No Django here: the caller stores what `convert` returns (sealed) and keeps the `state`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from runners.github.errors import GitHubError

# What Zoomies asks for (GitHub's autoscaling docs on the App permissions runner management
# needs): runners at a repository need administration, at an organization the
# self-hosted runners permission; jobs and runs are read through actions; metadata is
# every App's. installation and installation_repositories events come to every App.
PERMISSIONS = {
    "actions": "read",
    "administration": "write",
    "metadata": "read",
    "organization_self_hosted_runners": "write",
}
EVENTS = ["workflow_job"]
# An App's name on GitHub is at most 34 characters.
MAX_NAME = 34


def web_base(api_url: str) -> str:
    """The web address beside an API base: github.com for api.github.com, the host itself
    for GHES (`https://ghe.example/api/v3`) and for anything else (a local stand-in)."""
    parts = urlsplit(api_url.rstrip("/"))
    if parts.netloc == "api.github.com":
        return "https://github.com"
    path = parts.path.removesuffix("/api/v3")
    return f"{parts.scheme}://{parts.netloc}{path}"


def manifest(*, name: str, public_url: str) -> dict[str, Any]:
    """The manifest for an App named `name` whose webhooks go to this controller at
    `public_url` (server.public_url: GitHub must reach it) and which sends the operator back
    to it when created."""
    base = public_url.rstrip("/")
    return {
        "name": name[:MAX_NAME],
        "url": base,
        "description": "Ephemeral self-hosted runners, made for each queued job by Zoomies.",
        "hook_attributes": {"url": f"{base}/webhooks/github", "active": True},
        "redirect_url": f"{base}/settings/github-app/created",
        "public": False,
        "default_permissions": dict(PERMISSIONS),
        "default_events": list(EVENTS),
    }


def new_app_url(api_url: str, *, state: str, organization: str = "") -> str:
    """Where the browser POSTs the manifest: the user's new-App page, or an organization's."""
    web = web_base(api_url)
    owner = f"/organizations/{quote(organization, safe='')}" if organization else ""
    return f"{web}{owner}/settings/apps/new?state={quote(state, safe='')}"


@dataclass(frozen=True)
class ConvertedApp:
    """What GitHub hands back once, for the code: never logged, stored sealed."""

    app_id: int
    slug: str
    html_url: str
    pem: str
    webhook_secret: str | None
    client_id: str

    @property
    def install_url(self) -> str:
        return f"{self.html_url.rstrip('/')}/installations/new"


class ConversionFailed(GitHubError):
    """The code was refused (404: unknown or over an hour old; 422) or the answer was not
    an App."""


def convert(api_url: str, code: str, *, client: httpx.Client | None = None) -> ConvertedApp:
    url = f"{api_url.rstrip('/')}/app-manifests/{quote(code, safe='')}/conversions"
    headers = {
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28",
        "User-Agent": "zoomies",
    }
    own = client is None
    http = client or httpx.Client(timeout=30)
    try:
        answer = http.post(url, headers=headers)
    except httpx.HTTPError as exc:
        raise ConversionFailed(f"GitHub could not be reached to convert the code: {exc}") from exc
    finally:
        if own:
            http.close()
    if answer.status_code != 201:
        message = ""
        try:
            message = str(answer.json().get("message") or "")
        except (ValueError, AttributeError):
            pass
        raise ConversionFailed(
            f"GitHub refused the App's code ({answer.status_code} {message}): codes work once, "
            "for an hour; create the App again"
        )
    try:
        body = answer.json()
        return ConvertedApp(
            app_id=int(body["id"]),
            slug=str(body["slug"]),
            html_url=str(body["html_url"]),
            pem=str(body["pem"]),
            webhook_secret=body.get("webhook_secret"),
            client_id=str(body["client_id"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConversionFailed(f"GitHub's answer for the code is not an App: {exc}") from exc


def manifest_json(**kwargs: Any) -> str:
    return json.dumps(manifest(**kwargs))
