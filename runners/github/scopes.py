"""Where an installation's runner registrations can live (the registration reap's targets).

A pool registers its runners at its repository when it names one, else at the organisation
(`runners.registrations.registration_target`). So under an organisation installation the
registrations are at the organisation and at every repository a pool names: listing only
the organisation would leave a repository pool's orphans registered for ever.

Pure: the caller reads the pools' repositories.
"""

from __future__ import annotations

from collections.abc import Iterable


def registration_scopes(
    kind: str, account: str, repositories: Iterable[str], pool_repositories: Iterable[str]
) -> list[dict[str, str]]:
    """The `org=`/`repo=` targets to list, each once (repositories case-insensitively).

    `kind` is the installation's ("org", "repo" or "enterprise"); `repositories` are the
    ones it covers (used for a repository installation, whose runners register at each);
    `pool_repositories` are those pools name. Only repositories of the installation's own
    account count: another account's belong to another installation.
    """
    owner = account.lower()
    ours = [r for r in pool_repositories if _owner(r) == owner]
    targets: list[dict[str, str]] = []
    repos: list[str] = []
    if kind == "org":
        targets.append({"org": account})
        repos = ours
    elif kind == "repo":
        repos = [*repositories, *ours]
    seen: set[str] = set()
    for repo in repos:
        if _owner(repo) is not None and repo.lower() not in seen:
            seen.add(repo.lower())
            targets.append({"repo": repo})
    return targets


def _owner(repo: object) -> str | None:
    if not isinstance(repo, str) or repo.count("/") != 1 or not all(repo.split("/")):
        return None
    return repo.split("/")[0].lower()
