"""GitHub's JSON shapes, built from the fake's state.

Pure functions: each takes plain values and returns the dict GitHub would send, with every
field GitHub's response schema for it requires. No I/O, no clock.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

DOCS = "https://docs.github.com/rest"
DEFAULT_GROUP_ID = 1
DEFAULT_GROUP_NAME = "Default"

# The members of the runner's `RunnerSettings`, the `.runner` file's keys (actions/runner
# src/Runner.Common/ConfigurationStore.cs, [DataMember] properties; IsHostedServer is the
# DataMember name of a private field). The runner's JSON reader matches them regardless of case.
RUNNER_SETTINGS_KEYS = (
    "IsHostedServer",
    "AgentId",
    "AgentName",
    "SkipSessionRecover",
    "PoolId",
    "PoolName",
    "DisableUpdate",
    "Ephemeral",
    "ServerUrl",
    "GitHubUrl",
    "WorkFolder",
    "MonitorSocketAddress",
    "UseV2Flow",
    "UseRunnerAdminFlow",
    "ServerUrlV2",
)

# What GitHub adds at registration and marks read-only (actions/runner VarUtil.cs).
OS_LABELS = {"linux": "Linux", "macos": "macOS", "windows": "Windows"}
ARCH_LABELS = {"x86": "X86", "x64": "X64", "arm": "ARM", "arm64": "ARM64"}


def iso(ts: float | None) -> str | None:
    """Epoch seconds as GitHub's UTC timestamp (`2024-01-02T03:04:05Z`)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_id(kind: str, ident: int) -> str:
    """An opaque global node id, stable for a kind and id (GitHub's are base64 too)."""
    return base64.b64encode(f"0{len(kind)}:{kind}{ident}".encode()).decode().rstrip("=")


def simple_user(api: str, web: str, login: str, ident: int, kind: str = "User") -> dict[str, Any]:
    """GitHub's `simple-user` (also used for organizations as repository owners)."""
    users = f"{api}/users/{login}"
    return {
        "login": login,
        "id": ident,
        "node_id": node_id(kind, ident),
        "avatar_url": f"{web}/avatars/u/{ident}?v=4",
        "gravatar_id": "",
        "url": f"{api}/orgs/{login}" if kind == "Organization" else users,
        "html_url": f"{web}/{login}",
        "followers_url": f"{users}/followers",
        "following_url": f"{users}/following{{/other_user}}",
        "gists_url": f"{users}/gists{{/gist_id}}",
        "starred_url": f"{users}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{users}/subscriptions",
        "organizations_url": f"{users}/orgs",
        "repos_url": f"{users}/repos",
        "events_url": f"{users}/events{{/privacy}}",
        "received_events_url": f"{users}/received_events",
        "type": kind,
        "site_admin": False,
        "user_view_type": "public",
    }


def organization_simple(api: str, web: str, login: str, ident: int) -> dict[str, Any]:
    """GitHub's `organization-simple`, the `organization` key of a delivery."""
    org = f"{api}/orgs/{login}"
    return {
        "login": login,
        "id": ident,
        "node_id": node_id("Organization", ident),
        "url": org,
        "repos_url": f"{org}/repos",
        "events_url": f"{org}/events",
        "hooks_url": f"{org}/hooks",
        "issues_url": f"{org}/issues",
        "members_url": f"{org}/members{{/member}}",
        "public_members_url": f"{org}/public_members{{/member}}",
        "avatar_url": f"{web}/avatars/u/{ident}?v=4",
        "description": "",
    }


def repository(
    api: str,
    web: str,
    *,
    ident: int,
    name: str,
    owner: dict[str, Any],
    created_at: float,
) -> dict[str, Any]:
    """GitHub's full `repository` (a superset of `minimal-repository`)."""
    full = f"{owner['login']}/{name}"
    url = f"{api}/repos/{full}"
    host = web.split("://", 1)[-1]
    stamp = iso(created_at)
    return {
        "id": ident,
        "node_id": node_id("Repository", ident),
        "name": name,
        "full_name": full,
        "private": True,
        "owner": owner,
        "html_url": f"{web}/{full}",
        "description": None,
        "fork": False,
        "url": url,
        "archive_url": f"{url}/{{archive_format}}{{/ref}}",
        "assignees_url": f"{url}/assignees{{/user}}",
        "blobs_url": f"{url}/git/blobs{{/sha}}",
        "branches_url": f"{url}/branches{{/branch}}",
        "collaborators_url": f"{url}/collaborators{{/collaborator}}",
        "comments_url": f"{url}/comments{{/number}}",
        "commits_url": f"{url}/commits{{/sha}}",
        "compare_url": f"{url}/compare/{{base}}...{{head}}",
        "contents_url": f"{url}/contents/{{+path}}",
        "contributors_url": f"{url}/contributors",
        "deployments_url": f"{url}/deployments",
        "downloads_url": f"{url}/downloads",
        "events_url": f"{url}/events",
        "forks_url": f"{url}/forks",
        "git_commits_url": f"{url}/git/commits{{/sha}}",
        "git_refs_url": f"{url}/git/refs{{/sha}}",
        "git_tags_url": f"{url}/git/tags{{/sha}}",
        "git_url": f"git://{host}/{full}.git",
        "hooks_url": f"{url}/hooks",
        "issue_comment_url": f"{url}/issues/comments{{/number}}",
        "issue_events_url": f"{url}/issues/events{{/number}}",
        "issues_url": f"{url}/issues{{/number}}",
        "keys_url": f"{url}/keys{{/key_id}}",
        "labels_url": f"{url}/labels{{/name}}",
        "languages_url": f"{url}/languages",
        "merges_url": f"{url}/merges",
        "milestones_url": f"{url}/milestones{{/number}}",
        "notifications_url": f"{url}/notifications{{?since,all,participating}}",
        "pulls_url": f"{url}/pulls{{/number}}",
        "releases_url": f"{url}/releases{{/id}}",
        "ssh_url": f"git@{host}:{full}.git",
        "stargazers_url": f"{url}/stargazers",
        "statuses_url": f"{url}/statuses/{{sha}}",
        "subscribers_url": f"{url}/subscribers",
        "subscription_url": f"{url}/subscription",
        "tags_url": f"{url}/tags",
        "teams_url": f"{url}/teams",
        "trees_url": f"{url}/git/trees{{/sha}}",
        "clone_url": f"{web}/{full}.git",
        "mirror_url": None,
        "svn_url": f"{web}/{full}",
        "homepage": None,
        "language": None,
        "forks_count": 0,
        "stargazers_count": 0,
        "watchers_count": 0,
        "size": 0,
        "default_branch": "main",
        "open_issues_count": 0,
        "is_template": False,
        "topics": [],
        "has_issues": True,
        "has_projects": True,
        "has_wiki": True,
        "has_pages": False,
        "has_downloads": True,
        "has_discussions": False,
        "archived": False,
        "disabled": False,
        "visibility": "private",
        "pushed_at": stamp,
        "created_at": stamp,
        "updated_at": stamp,
        "allow_forking": False,
        "web_commit_signoff_required": False,
        "license": None,
        "forks": 0,
        "open_issues": 0,
        "watchers": 0,
        "custom_properties": {},
    }


def runner_labels(requested: list[str], label_id: Any) -> list[dict[str, Any]]:
    """A JIT runner's labels as GitHub registers them: exactly the ones in the body.

    GitHub adds no `self-hosted`, OS or architecture label to a JIT runner (only `config.sh` adds
    those): a caller that wants them sends them. Those names, when sent, are recognised
    case-insensitively, take their canonical spelling and are read-only (the spec example
    `runner-jitconfig`); everything else is custom. `label_id(name)` gives a stable id.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for label in requested:
        key = label.lower()
        if key in seen:
            continue
        seen.add(key)
        if key == "self-hosted":
            out.append({"id": label_id("self-hosted"), "name": "self-hosted", "type": "read-only"})
        elif key in OS_LABELS or key in ARCH_LABELS:
            name = OS_LABELS.get(key) or ARCH_LABELS[key]
            out.append({"id": label_id(name), "name": name, "type": "read-only"})
        else:
            out.append({"id": label_id(label), "name": label, "type": "custom"})
    return out


def runner_group(api: str, org: str) -> dict[str, Any]:
    """The org's Default runner group (id 1), as GitHub's `runner-groups-org`."""
    groups = f"{api}/orgs/{org}/actions/runner-groups/{DEFAULT_GROUP_ID}"
    return {
        "id": DEFAULT_GROUP_ID,
        "name": DEFAULT_GROUP_NAME,
        "visibility": "all",
        "default": True,
        "runners_url": f"{groups}/runners",
        "inherited": False,
        "allows_public_repositories": False,
        "restricted_to_workflows": False,
        "selected_workflows": [],
        "workflow_restrictions_read_only": False,
    }


def job_steps(status: str, conclusion: str | None, started: float, ended: float | None) -> list:
    """The steps list of a job: none while queued, `Set up job` running, then all done."""
    if status == "queued":
        return []
    if status == "in_progress":
        return [
            {
                "name": "Set up job",
                "status": "in_progress",
                "conclusion": None,
                "number": 1,
                "started_at": iso(started),
                "completed_at": None,
            }
        ]
    # A failed job's last step fails; other conclusions apply to every step.
    step_conclusion = "success" if conclusion == "failure" else conclusion
    names = ["Set up job", "Run tests", "Complete job"]
    steps = []
    for number, name in enumerate(names, start=1):
        this = conclusion if (conclusion == "failure" and name == "Run tests") else step_conclusion
        if this not in ("success", "failure", "skipped", "cancelled"):
            this = "cancelled"
        steps.append(
            {
                "name": name,
                "status": "completed",
                "conclusion": this,
                "number": number,
                "started_at": iso(started),
                "completed_at": iso(ended),
            }
        )
    return steps
