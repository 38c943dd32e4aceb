"""What the GitHub client raises.

Every error is a `GitHubError`, so a loop can catch one class and carry on. The subclasses
are the answers a caller acts on differently: `RateLimited` stands an installation down
until `retry_at` (POLL-05, POLL-06), `NotFound` and `Conflict` are answers about the thing
asked for, and `TransportError` means GitHub was never heard from.

No message ever contains a credential: the client builds them from the method, the path,
the status and GitHub's own error message, never from headers.
"""

from __future__ import annotations


class GitHubError(Exception):
    """A GitHub call that did not give the answer asked for."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        installation_id: int | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.installation_id = installation_id
        self.method = method
        self.path = path


class TransportError(GitHubError):
    """GitHub could not be reached: connection refused, a timeout, a broken connection."""


class NotFound(GitHubError):
    """404: the installation, repository, organisation or runner does not exist (or is hidden)."""


class Conflict(GitHubError):
    """409: for a JIT configuration, usually a runner with that name already exists."""


class RateLimited(GitHubError):
    """403 or 429 because a rate limit ran out.

    `retry_at` is when GitHub said the quota returns, in epoch seconds: the reset instant
    from `x-ratelimit-reset`, or the client's clock plus `retry-after`. It is None when the
    response said it was a rate limit but gave no time; the caller picks the fallback wait
    (POLL-07), because only it knows what else it is waiting on.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_at: float | None,
        status: int,
        installation_id: int | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(
            message, status=status, installation_id=installation_id, method=method, path=path
        )
        self.retry_at = retry_at
