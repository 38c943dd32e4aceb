"""One installation of the GitHub App: its runners, registrations, repositories and jobs.

`GitHubApp.for_installation(id)` (client.py) hands these out; every call goes through the
App's HTTP client, token cache, call accounting and conditional-list cache. No Django here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from runners.github.auth import parse_github_time
from runners.github.calls import CallStats, Listing
from runners.github.errors import GitHubError


class GitHubApp(Protocol):
    """What an installation's client calls on the App that made it (client.GitHubApp): its
    authenticated transport, accounting and answer checks. Named here, so this module does
    not import client.py, which imports this one (issue 22)."""

    def stats(self, installation_id: int | None) -> CallStats: ...

    def _installation_request(
        self,
        installation_id: int,
        method: str,
        path_or_url: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response: ...

    def _expect(
        self, response: httpx.Response, method: str, path: str, installation_id: int | None,
        *ok: int,
    ) -> None: ...  # fmt: skip

    def _error(
        self, response: httpx.Response, method: str, path: str, installation_id: int | None
    ) -> GitHubError: ...

    def _body(
        self, response: httpx.Response, method: str, path: str, installation_id: int | None
    ) -> Any: ...

    def _shape_error(self, method: str, path: str, installation_id: int | None) -> GitHubError: ...

    def _listing(
        self,
        call: Callable[[str, dict[str, Any] | None, dict[str, str]], httpx.Response],
        path: str,
        params: dict[str, Any],
        *,
        key: str | None,
        installation_id: int | None,
        conditional: bool,
        until: Callable[[list[Any]], bool] | None = None,
        page_limit: int | None = None,
    ) -> Listing: ...


MAX_RUNNER_NAME = 64  # GitHub's limit; the same number as runners.naming.MAX_RUNNER_NAME.
MAX_LABELS = 100  # generate-jitconfig takes 1..100 labels.


@dataclass(frozen=True)
class JitConfig:
    """A single-use runner configuration: the runner GitHub registered and its credential.

    `encoded_jit_config` is the only thing a runner's environment receives (SEC-05); it is a
    credential, so it is kept out of the repr.
    """

    runner_id: int
    name: str
    encoded_jit_config: str = field(repr=False)


def _q(segment: str) -> str:
    return quote(segment, safe="")


def repo_path(repo: str) -> str:
    """`/repos/{owner}/{name}` for `owner/name`, each half escaped."""
    parts = repo.split("/") if isinstance(repo, str) else []
    if len(parts) != 2 or not all(part.strip() for part in parts):
        raise ValueError(f"a repository is 'owner/name', not {repo!r}")
    return f"/repos/{_q(parts[0])}/{_q(parts[1])}"


def scope_path(org: str | None, repo: str | None) -> str:
    """The runner scope: `/orgs/{org}` or `/repos/{owner}/{name}`; exactly one is given."""
    if (org is None) == (repo is None):
        raise ValueError("give exactly one of org= or repo=")
    if org is not None:
        if not org.strip() or "/" in org:
            raise ValueError(f"an organisation is a bare login, not {org!r}")
        return f"/orgs/{_q(org)}"
    assert repo is not None  # noqa: S101  # narrows the type; the code above guarantees it
    return repo_path(repo)


class InstallationClient:
    """One installation of the App: its runners, registrations, repositories and jobs."""

    def __init__(self, app: GitHubApp, installation_id: int) -> None:
        self.app = app
        self.installation_id = installation_id

    def __repr__(self) -> str:
        return f"<InstallationClient installation_id={self.installation_id} app={self.app!r}>"

    @property
    def stats(self) -> CallStats:
        return self.app.stats(self.installation_id)

    def _request(
        self,
        method: str,
        path_or_url: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        return self.app._installation_request(
            self.installation_id, method, path_or_url, params=params, json=json, headers=headers
        )

    def _call(self, method: str, path: str, ok: int, *, json: Any = None) -> Any:
        response = self._request(method, path, json=json)
        self.app._expect(response, method, path, self.installation_id, ok)
        return self.app._body(response, method, path, self.installation_id)

    def _list(self, path: str, key: str, params: dict[str, Any] | None = None) -> list[Any]:
        return self._listing(path, key, params).items

    def _listing(
        self,
        path: str,
        key: str,
        params: dict[str, Any] | None = None,
        *,
        page_limit: int | None = None,
    ) -> Listing:
        """Every item (or the first `page_limit` pages), each page asked for with its last
        ETag (a 304 is free: see Listing)."""
        return self.app._listing(
            lambda url, page_params, headers: self._request(
                "GET", url, params=page_params, headers=headers
            ),
            path,
            params or {},
            key=key,
            installation_id=self.installation_id,
            conditional=True,
            page_limit=page_limit,
        )

    # -- runners -------------------------------------------------------------------------

    def generate_jitconfig(
        self,
        *,
        org: str | None = None,
        repo: str | None = None,
        name: str,
        labels: list[str],
        runner_group_id: int = 1,
        work_folder: str = "_work",
    ) -> JitConfig:
        """Register one single-use runner and return its JIT configuration.

        Raises Conflict when a runner of that name exists, and ValueError before any call
        for a name GitHub would refuse (over 64 characters) or a label list it would.
        """
        scope = scope_path(org, repo)
        if not isinstance(name, str) or not name.strip():
            raise ValueError("a runner needs a name")
        if len(name) > MAX_RUNNER_NAME:
            raise ValueError(
                f"runner name {name!r} is {len(name)} characters; GitHub allows {MAX_RUNNER_NAME}"
            )
        labels = list(labels)
        if not 1 <= len(labels) <= MAX_LABELS or not all(
            isinstance(label, str) and label.strip() for label in labels
        ):
            raise ValueError(f"a JIT runner takes 1 to {MAX_LABELS} non-empty labels")
        path = f"{scope}/actions/runners/generate-jitconfig"
        body = self._call(
            "POST",
            path,
            201,
            json={
                "name": name,
                "runner_group_id": int(runner_group_id),
                "labels": labels,
                "work_folder": work_folder,
            },
        )
        try:
            return JitConfig(
                runner_id=int(body["runner"]["id"]),
                name=str(body["runner"]["name"]),
                encoded_jit_config=str(body["encoded_jit_config"]),
            )
        except (KeyError, TypeError, ValueError):
            raise self.app._shape_error("POST", path, self.installation_id) from None

    def registration_token(
        self, *, org: str | None = None, repo: str | None = None
    ) -> tuple[str, datetime]:
        """A registration token for `config.sh` (non-ephemeral pools) and its expiry."""
        path = f"{scope_path(org, repo)}/actions/runners/registration-token"
        body = self._call("POST", path, 201)
        try:
            return str(body["token"]), parse_github_time(body["expires_at"])
        except (KeyError, TypeError, ValueError):
            raise self.app._shape_error("POST", path, self.installation_id) from None

    def list_runners(
        self, *, org: str | None = None, repo: str | None = None
    ) -> list[dict[str, Any]]:
        """Every self-hosted runner registered at the org or repository, all pages."""
        return self._list(f"{scope_path(org, repo)}/actions/runners", "runners")

    def delete_runner(
        self, *, org: str | None = None, repo: str | None = None, runner_id: int
    ) -> str:
        """Deregister a runner: "deleted", "busy" (422: it has a job) or "gone" (404).

        "busy" is an answer rather than an error: the caller must leave the workload alone:
        a runner checked idle may have taken a job since, and destroying it would kill the job.
        """
        path = f"{scope_path(org, repo)}/actions/runners/{int(runner_id)}"
        response = self._request("DELETE", path)
        if response.status_code == 204:
            return "deleted"
        if response.status_code == 422:
            return "busy"
        if response.status_code == 404:
            return "gone"
        raise self.app._error(response, "DELETE", path, self.installation_id)

    # -- repositories and jobs -------------------------------------------------------------

    def repositories(self) -> list[str]:
        """Full names of the repositories this installation can see, all pages."""
        repos = self._list("/installation/repositories", "repositories")
        try:
            return [str(repo["full_name"]) for repo in repos]
        except (KeyError, TypeError):
            raise self.app._shape_error(
                "GET", "/installation/repositories", self.installation_id
            ) from None

    def list_runs(self, repo: str, status: str) -> list[dict[str, Any]]:
        """Workflow runs of a repository in one status (GitHub caps a filtered list at 1,000)."""
        return self.runs(repo, status).items

    def runs(self, repo: str, status: str) -> Listing:
        """`list_runs` with whether anything changed since the last time it was asked."""
        return self._listing(f"{repo_path(repo)}/actions/runs", "workflow_runs", {"status": status})

    def runs_created_since(self, repo: str, since: datetime, *, pages: int = 1) -> Listing:
        """The repository's newest runs of any status created at or after `since`, the first
        `pages` pages (100 a page, newest first): GitHub's `created` filter in its search
        syntax, `>=2026-12-06T03:00:00+00:00`."""
        stamp = since.astimezone(UTC).replace(microsecond=0).isoformat()
        return self._listing(
            f"{repo_path(repo)}/actions/runs",
            "workflow_runs",
            {"created": f">={stamp}"},
            page_limit=pages,
        )

    def job(self, repo: str, job_id: int) -> dict[str, Any]:
        """One workflow job (NotFound when GitHub has none by that id in `repo`)."""
        body = self._call("GET", f"{repo_path(repo)}/actions/jobs/{int(job_id)}", 200)
        if not isinstance(body, dict):
            raise self.app._shape_error(
                "GET", f"{repo_path(repo)}/actions/jobs", self.installation_id
            )
        return body

    def list_run_jobs(self, repo: str, run_id: int) -> list[dict[str, Any]]:
        """The jobs of one run (its latest attempt), all pages."""
        return self.run_jobs(repo, run_id).items

    def run_jobs(self, repo: str, run_id: int) -> Listing:
        """`list_run_jobs` with whether anything changed since it was last asked."""
        return self._listing(f"{repo_path(repo)}/actions/runs/{int(run_id)}/jobs", "jobs")

    def active_jobs(self, repo: str) -> list[dict[str, Any]]:
        """Every job of the repository's queued and in-progress runs, once each.

        What the poller needs (architecture: "When webhooks cannot reach you"): the queued
        jobs to schedule and the running ones that tell it a runner went busy. Jobs of those
        runs that already finished are included too; the poller filters by `status`.
        """
        jobs: dict[int, dict[str, Any]] = {}
        runs_seen: set[int] = set()
        for status in ("queued", "in_progress"):
            for run in self.list_runs(repo, status):
                # A run can move from queued to in_progress between the two listings.
                if run["id"] in runs_seen:
                    continue
                runs_seen.add(run["id"])
                for job in self.list_run_jobs(repo, run["id"]):
                    jobs.setdefault(job["id"], job)
        return list(jobs.values())
