"""The fake GitHub's App and installation routes, scope checks and pagination."""

from __future__ import annotations

import math
import secrets
import urllib.parse
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.core import (
    _ALNUM,
    _Error,
    _Installation,
    _positive_int,
    _Repo,
    _Request,
    _Response,
    _Token,
)
from runners.github.fake.shapes import iso


class AppApiMixin:
    """`/app`, `/app/installations`, tokens, `/installation/repositories`, `/rate_limit`."""

    def _org_scope(self, req: _Request) -> _Installation:
        inst = self._installations.get(req.installation_id or -1)
        org = req.params["org"].lower()
        if inst is None or inst.account_type != "Organization" or inst.account.lower() != org:
            raise _Error(404, "Not Found")
        return inst

    def _repo_scope(self, req: _Request) -> _Repo:
        key = f"{req.params['owner']}/{req.params['repo']}".lower()
        repo = self._repos.get(key)
        token = req.token
        if (
            repo is None
            or token is None
            or repo.installation_id != token.installation_id
            or (token.repositories is not None and key not in token.repositories)
        ):
            raise _Error(404, "Not Found")
        return repo

    def _runner_scope(self, req: _Request) -> tuple[str, str]:
        if "org" in req.params:
            return ("org", self._org_scope(req).account.lower())
        return ("repo", self._repo_scope(req).full_name.lower())

    def _int_param(self, req: _Request, name: str) -> int:
        try:
            return int(req.params[name])
        except ValueError:
            raise _Error(404, "Not Found") from None

    def _paginate(self, req: _Request, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
        per_page = _positive_int(req.q("per_page"), 30)
        per_page = min(per_page, 100)
        page = _positive_int(req.q("page"), 1)
        last = max(1, math.ceil(len(items) / per_page))
        chunk = items[(page - 1) * per_page : page * per_page]

        def link(number: int, rel: str) -> str:
            params = {k: v[-1] for k, v in req.query.items()}
            params.update(per_page=str(per_page), page=str(number))
            return f'<{self.url}{req.path}?{urllib.parse.urlencode(params)}>; rel="{rel}"'

        links = []
        if page > 1:
            links.append(link(min(page - 1, last), "prev"))
        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links.append(link(1, "first"))
        return chunk, ({"Link": ", ".join(links)} if links else {})

    def _get_app(self, req: _Request) -> _Response:
        owner = shapes.simple_user(self.url, self.url, "zoomies-dev", 7_000_001)
        body = {
            "id": self.app_id,
            "slug": self.app_slug,
            "client_id": self.client_id,
            "node_id": shapes.node_id("Integration", self.app_id),
            "owner": owner,
            "name": "Zoomies (fake)",
            "description": "Ephemeral self-hosted runners",
            "external_url": f"{self.url}/zoomies",
            "html_url": f"{self.url}/apps/{self.app_slug}",
            "created_at": iso(self._created_at),
            "updated_at": iso(self._created_at),
            "permissions": self._permissions("Organization"),
            "events": ["workflow_job"],
            "installations_count": len(self._installations),
        }
        return _Response(200, body)

    def _permissions(self, account_type: str) -> dict[str, str]:
        perms = {"actions": "read", "administration": "write", "metadata": "read"}
        if account_type == "Organization":
            perms["organization_self_hosted_runners"] = "write"
        return perms

    def _installation_json(self, inst: _Installation, *, listed: bool = False) -> dict[str, Any]:
        account = shapes.simple_user(
            self.url, self.url, inst.account, inst.account_id, inst.account_type
        )
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
            f"{self.url}/organizations/{inst.account}/settings/installations/{inst.id}"
            if inst.account_type == "Organization"
            else f"{self.url}/settings/installations/{inst.id}"
        )
        return {
            "id": inst.id,
            "account": account,
            "repository_selection": "selected",
            "access_tokens_url": f"{self.url}/app/installations/{inst.id}/access_tokens",
            "repositories_url": f"{self.url}/installation/repositories",
            "html_url": settings,
            "app_id": self.app_id,
            "client_id": self.client_id,
            "app_slug": self.app_slug,
            "target_id": inst.account_id,
            "target_type": inst.account_type,
            "permissions": self._permissions(inst.account_type),
            "events": ["workflow_job"],
            "created_at": iso(inst.created_at),
            "updated_at": iso(inst.created_at),
            "single_file_name": None,
            "has_multiple_single_files": False,
            "single_file_paths": [],
            "suspended_by": None,
            "suspended_at": None,
        }

    def _list_installations(self, req: _Request) -> _Response:
        items = [self._installation_json(i, listed=True) for i in self._installations.values()]
        chunk, headers = self._paginate(req, items)
        return _Response(200, chunk, headers)

    def _installation_by_param(self, req: _Request) -> _Installation:
        inst = self._installations.get(self._int_param(req, "installation_id"))
        if inst is None:
            raise _Error(404, "Not Found")
        return inst

    def _get_installation(self, req: _Request) -> _Response:
        return _Response(200, self._installation_json(self._installation_by_param(req)))

    def _get_org_installation(self, req: _Request) -> _Response:
        org = req.params["org"].lower()
        for inst in self._installations.values():
            if inst.account_type == "Organization" and inst.account.lower() == org:
                return _Response(200, self._installation_json(inst))
        raise _Error(404, "Not Found")

    def _get_repo_installation(self, req: _Request) -> _Response:
        repo = self._repos.get(f"{req.params['owner']}/{req.params['repo']}".lower())
        if repo is None:
            raise _Error(404, "Not Found")
        return _Response(200, self._installation_json(self._installations[repo.installation_id]))

    def _create_token(self, req: _Request) -> _Response:
        inst = self._installation_by_param(req)
        body = req.json(required=False)
        if not isinstance(body, dict):
            raise _Error(422, "Invalid request.\n\nThe body must be an object.")
        granted = self._permissions(inst.account_type)
        wanted = body.get("permissions")
        permissions = dict(granted)
        if wanted is not None:
            if not isinstance(wanted, dict) or any(
                granted.get(k) not in ("write", v) for k, v in wanted.items()
            ):
                raise _Error(422, "The permissions requested are not granted to this installation.")
            permissions = dict(wanted)
        narrowed: set[str] | None = None
        names, ids = body.get("repositories"), body.get("repository_ids")
        if names is not None or ids is not None:
            narrowed = set()
            by_name = {self._repos[r.lower()].name.lower(): r.lower() for r in inst.repositories}
            by_id = {self._repos[r.lower()].id: r.lower() for r in inst.repositories}
            for name in names or []:
                short = str(name).rsplit("/", 1)[-1].lower()
                if short not in by_name:
                    raise _Error(
                        422,
                        "There is at least one repository that does not exist or is not "
                        "accessible to the parent installation.",
                    )
                narrowed.add(by_name[short])
            for ident in ids or []:
                if ident not in by_id:
                    raise _Error(
                        422,
                        "There is at least one repository that does not exist or is not "
                        "accessible to the parent installation.",
                    )
                narrowed.add(by_id[ident])
        token = _Token(
            token="ghs_" + "".join(secrets.choice(_ALNUM) for _ in range(36)),
            installation_id=inst.id,
            expires_at=self.clock() + self.token_lifetime,
            repositories=narrowed,
            permissions=permissions,
        )
        self._tokens[token.token] = token
        out: dict[str, Any] = {
            "token": token.token,
            "expires_at": iso(token.expires_at),
            "permissions": permissions,
            "repository_selection": "selected",
        }
        if narrowed is not None:
            out["repositories"] = [self._repo_json(self._repos[k]) for k in sorted(narrowed)]
        return _Response(201, out)

    def _list_repositories(self, req: _Request) -> _Response:
        assert req.token is not None  # noqa: S101  # narrows the type; the code above guarantees it
        inst = self._installations[req.token.installation_id]
        repos = [
            self._repos[r.lower()]
            for r in inst.repositories
            if req.token.repositories is None or r.lower() in req.token.repositories
        ]
        chunk, headers = self._paginate(req, [self._repo_json(r) for r in repos])
        body = {
            "total_count": len(repos),
            "repositories": chunk,
            "repository_selection": "selected",
        }
        return _Response(200, body, headers)

    def _get_rate_limit(self, req: _Request) -> _Response:
        limit, remaining, used, maybe_reset = self._rate_numbers(req.principal)
        if maybe_reset is None:  # the "said nothing" limit: the body still needs a number
            maybe_reset = math.ceil(self._quota(req.principal).reset)
        reset = maybe_reset
        core = {"limit": limit, "remaining": remaining, "reset": reset, "used": used}
        later = int(self.clock()) + 60
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
        return _Response(200, {"resources": resources, "rate": core})
