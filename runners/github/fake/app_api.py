"""The fake GitHub's App and installation routes (`/app`, `/app/installations`, tokens,
`/installation/repositories`, `/rate_limit`), and what the other routes share: scope checks,
pagination and the installation and repository shapes."""

from __future__ import annotations

import math
import secrets
import urllib.parse
from typing import Any

from runners.github.fake import auth, shapes
from runners.github.fake.core import ALNUM, HttpError, Request, Response, positive_int
from runners.github.fake.shapes import iso
from runners.github.fake.state import FakeState, Installation, Repo, Token


def org_scope(state: FakeState, req: Request) -> Installation:
    inst = state.installations.get(req.installation_id or -1)
    org = req.params["org"].lower()
    if inst is None or inst.account_type != "Organization" or inst.account.lower() != org:
        raise HttpError(404, "Not Found")
    return inst


def repo_scope(state: FakeState, req: Request) -> Repo:
    key = f"{req.params['owner']}/{req.params['repo']}".lower()
    repo = state.repos.get(key)
    token = req.token
    if (
        repo is None
        or token is None
        or repo.installation_id != token.installation_id
        or (token.repositories is not None and key not in token.repositories)
    ):
        raise HttpError(404, "Not Found")
    return repo


def runner_scope(state: FakeState, req: Request) -> tuple[str, str]:
    if "org" in req.params:
        return ("org", org_scope(state, req).account.lower())
    return ("repo", repo_scope(state, req).full_name.lower())


def int_param(req: Request, name: str) -> int:
    try:
        return int(req.params[name])
    except ValueError:
        raise HttpError(404, "Not Found") from None


def paginate(state: FakeState, req: Request, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
    per_page = positive_int(req.q("per_page"), 30)
    per_page = min(per_page, 100)
    page = positive_int(req.q("page"), 1)
    last = max(1, math.ceil(len(items) / per_page))
    chunk = items[(page - 1) * per_page : page * per_page]

    def link(number: int, rel: str) -> str:
        params = {k: v[-1] for k, v in req.query.items()}
        params.update(per_page=str(per_page), page=str(number))
        return f'<{state.url}{req.path}?{urllib.parse.urlencode(params)}>; rel="{rel}"'

    links = []
    if page > 1:
        links.append(link(min(page - 1, last), "prev"))
    if page < last:
        links += [link(page + 1, "next"), link(last, "last")]
    if page > 1:
        links.append(link(1, "first"))
    return chunk, ({"Link": ", ".join(links)} if links else {})


def sender(state: FakeState) -> dict[str, Any]:
    """The user GitHub names as a delivery's sender and a run's actor."""
    return shapes.simple_user(state.url, state.url, "monalisa", 7_000_002)


def permissions(account_type: str) -> dict[str, str]:
    perms = {"actions": "read", "administration": "write", "metadata": "read"}
    if account_type == "Organization":
        perms["organization_self_hosted_runners"] = "write"
    return perms


def installation_json(
    state: FakeState, inst: Installation, *, listed: bool = False
) -> dict[str, Any]:
    url = state.url
    account = shapes.simple_user(url, url, inst.account, inst.account_id, inst.account_type)
    if listed:
        # GitHub's spec types this list's account as allOf[Simple User, Enterprise]
        # (which no object satisfies as written); these four extra keys make it validate
        # and harm no client.
        account.update(
            name=inst.account,
            slug=inst.account.lower(),
            created_at=iso(inst.created_at),
            updated_at=iso(inst.created_at),
        )
    settings = (
        f"{url}/organizations/{inst.account}/settings/installations/{inst.id}"
        if inst.account_type == "Organization"
        else f"{url}/settings/installations/{inst.id}"
    )
    return {
        "id": inst.id,
        "account": account,
        "repository_selection": "selected",
        "access_tokens_url": f"{url}/app/installations/{inst.id}/access_tokens",
        "repositories_url": f"{url}/installation/repositories",
        "html_url": settings,
        "app_id": state.app_id,
        "client_id": state.client_id,
        "app_slug": state.app_slug,
        "target_id": inst.account_id,
        "target_type": inst.account_type,
        "permissions": permissions(inst.account_type),
        "events": ["workflow_job"],
        "created_at": iso(inst.created_at),
        "updated_at": iso(inst.created_at),
        "single_file_name": None,
        "has_multiple_single_files": False,
        "single_file_paths": [],
        "suspended_by": None,
        "suspended_at": None,
    }


def repo_json(state: FakeState, repo: Repo) -> dict[str, Any]:
    inst = state.installations[repo.installation_id]
    owner = shapes.simple_user(
        state.url, state.url, inst.account, inst.account_id, inst.account_type
    )
    return shapes.repository(
        state.url,
        state.url,
        ident=repo.id,
        name=repo.name,
        owner=owner,
        created_at=repo.created_at,
    )


def get_app(state: FakeState, req: Request) -> Response:
    url = state.url
    owner = shapes.simple_user(url, url, "zoomies-dev", 7_000_001)
    body = {
        "id": state.app_id,
        "slug": state.app_slug,
        "client_id": state.client_id,
        "node_id": shapes.node_id("Integration", state.app_id),
        "owner": owner,
        "name": "Zoomies (fake)",
        "description": "Ephemeral self-hosted runners",
        "external_url": f"{url}/zoomies",
        "html_url": f"{url}/apps/{state.app_slug}",
        "created_at": iso(state.created_at),
        "updated_at": iso(state.created_at),
        "permissions": permissions("Organization"),
        "events": ["workflow_job"],
        "installations_count": len(state.installations),
    }
    return Response(200, body)


def list_installations(state: FakeState, req: Request) -> Response:
    items = [installation_json(state, i, listed=True) for i in state.installations.values()]
    chunk, headers = paginate(state, req, items)
    return Response(200, chunk, headers)


def installation_by_param(state: FakeState, req: Request) -> Installation:
    inst = state.installations.get(int_param(req, "installation_id"))
    if inst is None:
        raise HttpError(404, "Not Found")
    return inst


def get_installation(state: FakeState, req: Request) -> Response:
    return Response(200, installation_json(state, installation_by_param(state, req)))


def get_org_installation(state: FakeState, req: Request) -> Response:
    org = req.params["org"].lower()
    for inst in state.installations.values():
        if inst.account_type == "Organization" and inst.account.lower() == org:
            return Response(200, installation_json(state, inst))
    raise HttpError(404, "Not Found")


def get_repo_installation(state: FakeState, req: Request) -> Response:
    repo = state.repos.get(f"{req.params['owner']}/{req.params['repo']}".lower())
    if repo is None:
        raise HttpError(404, "Not Found")
    return Response(200, installation_json(state, state.installations[repo.installation_id]))


def create_token(state: FakeState, req: Request) -> Response:
    inst = installation_by_param(state, req)
    body = req.json(required=False)
    if not isinstance(body, dict):
        raise HttpError(422, "Invalid request.\n\nThe body must be an object.")
    granted = permissions(inst.account_type)
    wanted = body.get("permissions")
    chosen = dict(granted)
    if wanted is not None:
        if not isinstance(wanted, dict) or any(
            granted.get(k) not in ("write", v) for k, v in wanted.items()
        ):
            raise HttpError(422, "The permissions requested are not granted to this installation.")
        chosen = dict(wanted)
    narrowed: set[str] | None = None
    names, ids = body.get("repositories"), body.get("repository_ids")
    if names is not None or ids is not None:
        narrowed = set()
        by_name = {state.repos[r.lower()].name.lower(): r.lower() for r in inst.repositories}
        by_id = {state.repos[r.lower()].id: r.lower() for r in inst.repositories}
        for name in names or []:
            short = str(name).rsplit("/", 1)[-1].lower()
            if short not in by_name:
                raise HttpError(
                    422,
                    "There is at least one repository that does not exist or is not "
                    "accessible to the parent installation.",
                )
            narrowed.add(by_name[short])
        for ident in ids or []:
            if ident not in by_id:
                raise HttpError(
                    422,
                    "There is at least one repository that does not exist or is not "
                    "accessible to the parent installation.",
                )
            narrowed.add(by_id[ident])
    token = Token(
        token="ghs_" + "".join(secrets.choice(ALNUM) for _ in range(36)),
        installation_id=inst.id,
        expires_at=state.clock() + state.token_lifetime,
        repositories=narrowed,
        permissions=chosen,
    )
    state.tokens[token.token] = token
    out: dict[str, Any] = {
        "token": token.token,
        "expires_at": iso(token.expires_at),
        "permissions": chosen,
        "repository_selection": "selected",
    }
    if narrowed is not None:
        out["repositories"] = [repo_json(state, state.repos[k]) for k in sorted(narrowed)]
    return Response(201, out)


def list_repositories(state: FakeState, req: Request) -> Response:
    assert req.token is not None  # noqa: S101  # narrows the type; the code above guarantees it
    inst = state.installations[req.token.installation_id]
    repos = [
        state.repos[r.lower()]
        for r in inst.repositories
        if req.token.repositories is None or r.lower() in req.token.repositories
    ]
    chunk, headers = paginate(state, req, [repo_json(state, r) for r in repos])
    body = {
        "total_count": len(repos),
        "repositories": chunk,
        "repository_selection": "selected",
    }
    return Response(200, body, headers)


def get_rate_limit(state: FakeState, req: Request) -> Response:
    limit, remaining, used, maybe_reset = auth.rate_numbers(state, req.principal)
    if maybe_reset is None:  # the "said nothing" limit: the body still needs a number
        maybe_reset = math.ceil(auth.quota(state, req.principal).reset)
    reset = maybe_reset
    core = {"limit": limit, "remaining": remaining, "reset": reset, "used": used}
    later = int(state.clock()) + 60
    resources = {
        "core": core,
        "search": {"limit": 30, "remaining": 30, "reset": later, "used": 0},
        "graphql": {"limit": 5000, "remaining": 5000, "reset": reset, "used": 0},
        "integration_manifest": {"limit": 5000, "remaining": 5000, "reset": reset, "used": 0},
        "actions_runner_registration": {
            "limit": 10000,
            "remaining": 10000,
            "reset": reset,
            "used": 0,
        },
    }
    return Response(200, {"resources": resources, "rate": core})
