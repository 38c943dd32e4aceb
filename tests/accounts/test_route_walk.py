"""AUTH-03, AUTH-04: every /api/v1/ route, taken from the URL resolver, for every role and
every token scope. Allowed where the role (and the token) allow, 403 elsewhere, 401 when
anonymous; a token never does what its owner's role forbids, even one minted before its
owner was demoted. The agent routes take agent tokens only and answer 401 without one.
"""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from accounts.models import User
from accounts.roles import ALL_SCOPES
from fleet.models import Host
from tests.accounts.conftest import client_for, make_user, mint

pytestmark = pytest.mark.django_db

ROLE_RANK = {"viewer": 1, "operator": 2, "admin": 3}
SCOPE_RANK = {"fleet:read": 1, "fleet:write": 2, "admin": 3}
METHODS = ("get", "post", "put", "patch", "delete")

# What each route needs, as the product says (issue 10 item 2): (role, token scope) per
# method. A route not named here is a fleet route: reads are the viewer's with fleet:read,
# changes the operator's with fleet:write.
POLICY = {
    # Anyone signed in manages their own tokens; with a token, only the admin scope does.
    "api-tokens": {"GET": ("viewer", "fleet:read"), "POST": ("viewer", "admin")},
    "api-token-revoke": {"POST": ("viewer", "admin")},
    # Users are the admin's, reading included (issue 10 item 2).
    "api-users": {"GET": ("admin", "admin"), "POST": ("admin", "admin")},
    "api-user": {"GET": ("admin", "admin"), "PATCH": ("admin", "admin")},
    "api-user-deactivate": {"POST": ("admin", "admin")},
    # Backups are the admin's (issue 11 item 8).
    "api-backups": {"GET": ("admin", "admin"), "POST": ("admin", "admin")},
    "api-backup-verify": {"POST": ("admin", "admin")},
    # Installations and settings are the admin's to change (issue 10 item 2).
    "api-installations": {"POST": ("admin", "admin")},
    "api-installation": {"DELETE": ("admin", "admin")},
    "api-setting": {"PUT": ("admin", "admin"), "DELETE": ("admin", "admin")},
    # Machine providers and the release of a quarantined machine (issue 23 item 7).
    "api-providers": {"POST": ("admin", "admin")},
    "api-provider": {"PATCH": ("admin", "admin"), "DELETE": ("admin", "admin")},
    "api-machine-release": {"POST": ("admin", "admin")},
    # A provider's connection test asks the cluster with its saved token (issue 24 item 5).
    "api-provider-test": {"POST": ("admin", "admin")},
    # Proxmox onboarding (issue 24 item 4): the admin's, reading a setup included.
    "api-provider-setups": {"POST": ("admin", "admin")},
    "api-provider-setup": {"GET": ("admin", "admin")},
    "api-provider-setup-discover": {"POST": ("admin", "admin")},
}


def _walk(patterns, prefix=""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def _concrete(route: str) -> str:
    # A placeholder id: the permission check runs before any lookup, so an allowed caller
    # gets a 404, never a 403.
    return "/" + re.sub(r"<(?:\w+:)?\w+>", "999999", route)


def api_routes():
    found = []
    for route, entry in _walk(get_resolver().url_patterns):
        if not route.startswith("api/v1/") or route.startswith("api/v1/agent/"):
            continue
        view = getattr(entry.callback, "cls", None) or getattr(entry.callback, "view_class", None)
        assert view is not None, f"{route} is not a class-based API view"
        for method in METHODS:
            if hasattr(view, method):
                found.append((entry.name, _concrete(route), method.upper()))
    return found


def agent_routes():
    return [
        _concrete(route)
        for route, _entry in _walk(get_resolver().url_patterns)
        if route.startswith("api/v1/agent/")
    ]


ROUTES = api_routes()


def needs(name: str, method: str) -> tuple[str, str]:
    default = ("viewer", "fleet:read") if method in ("GET", "HEAD") else ("operator", "fleet:write")
    return POLICY.get(name, {}).get(method, default)


def test_the_walk_sees_the_routes_it_is_about():
    names = {name for name, _path, _method in ROUTES}
    assert {"api-pools", "api-runners", "api-hosts", "api-tokens", "api-audit"} <= names
    assert ("api-pools", "/api/v1/pools", "POST") in ROUTES
    assert all(name in names for name in POLICY), "a POLICY entry names no route"


def _call(client, method: str, path: str):
    body = {} if method in ("POST", "PUT", "PATCH") else None
    return client.generic(
        method, path, data=b"{}" if body is not None else "", content_type="application/json"
    )


@pytest.fixture
def callers(db):
    """A session per role, and per role a token of every scope.

    Each token is minted while its owner is an admin (so any scope may be given) and the
    owner is then moved to the role: the demotion case, where only the use-time cap holds.
    """
    sessions, tokens = {}, {}
    for role in ROLE_RANK:
        user = make_user(f"s-{role}", role)
        sessions[role] = client_for(user)
        for scope in ALL_SCOPES:
            owner = make_user(f"t-{role}-{scope.replace(':', '-')}", "admin")
            secret = mint(owner, [scope])
            User.objects.filter(pk=owner.pk).update(role=role)
            tokens[(role, scope)] = client_for(token=secret)
    return sessions, tokens


@pytest.mark.parametrize(
    ("name", "path", "method"), ROUTES, ids=[f"{m} {p}" for _n, p, m in ROUTES]
)
def test_auth03_auth04_each_route_for_each_role_and_scope(callers, name, path, method):
    sessions, tokens = callers
    need_role, need_scope = needs(name, method)

    anonymous = _call(client_for(), method, path)
    assert anonymous.status_code == 401, f"anonymous {method} {path}: {anonymous.status_code}"

    for role, client in sessions.items():
        status = _call(client, method, path).status_code
        allowed = ROLE_RANK[role] >= ROLE_RANK[need_role]
        assert (status not in (401, 403)) if allowed else status == 403, (
            f"{role} session {method} {path}: {status}"
        )

    for (role, scope), client in tokens.items():
        status = _call(client, method, path).status_code
        allowed = (
            ROLE_RANK[role] >= ROLE_RANK[need_role] and SCOPE_RANK[scope] >= SCOPE_RANK[need_scope]
        )
        assert (status not in (401, 403)) if allowed else status == 403, (
            f"{role}'s {scope} token {method} {path}: {status}"
        )


# /join is where an agent gets its token: its credential is the join token in the body.
JOIN = "/api/v1/agent/join"


@pytest.mark.parametrize("path", [p for p in agent_routes() if p != JOIN])
def test_auth03_agent_routes_refuse_everyone_without_an_agent_token(callers, path):
    sessions, tokens = callers
    for client in (client_for(), sessions["admin"], tokens[("admin", "admin")]):
        statuses = {m: _call(client, m, path).status_code for m in ("GET", "POST")}
        assert set(statuses.values()) <= {401, 405}, f"{path}: {statuses}"
        assert 401 in statuses.values(), f"{path}: {statuses}"


def test_auth03_no_user_credential_joins_a_host(callers):

    sessions, tokens = callers
    for client in (client_for(), sessions["admin"], tokens[("admin", "admin")]):
        assert _call(client, "POST", JOIN).status_code in (400, 401)
    assert not Host.objects.exists()


def test_auth04_a_viewer_cannot_mint_a_write_token_nor_create_a_pool():
    viewer = make_user("vic", "viewer")
    client = client_for(viewer)
    refused = client.post("/api/v1/tokens", {"name": "w", "scopes": ["fleet:write"]}, format="json")
    assert refused.status_code == 400
    assert "never exceeds its owner's role" in refused.json()["detail"]
    read = client.post("/api/v1/tokens", {"name": "r", "scopes": ["fleet:read"]}, format="json")
    assert read.status_code == 201
    with_token = client_for(token=read.json()["secret"])
    body = {"name": "zoomies-x", "labels": ["linux"], "backend": "process"}
    assert with_token.post("/api/v1/pools", body, format="json").status_code == 403


def test_auth04_demoting_an_owner_takes_the_power_from_their_tokens_at_once():
    otto = make_user("otto", "operator")
    secret = mint(otto, ["fleet:write"])
    client = client_for(token=secret)
    body = {"name": "zoomies-a", "labels": ["linux"], "backend": "process"}
    assert client.post("/api/v1/pools", body, format="json").status_code == 201
    User.objects.filter(pk=otto.pk).update(role="viewer")
    body["name"] = "zoomies-b"
    assert client.post("/api/v1/pools", body, format="json").status_code == 403
    assert client.get("/api/v1/pools").status_code == 200
