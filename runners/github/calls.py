"""What a GitHub call returns and costs: the types the App (client.py) and an installation's
client (installation.py) share, in a module of their own so neither imports the other for
them (issue 22: the client <-> installation circle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Listing:
    """Every item of a list endpoint, and whether any page differed from the last answer.

    `changed` is False only when GitHub answered 304 Not Modified for every page, which
    it does not count against the rate limit; the items are then the remembered ones.
    """

    items: list[Any]
    changed: bool = True
    charged_calls: int = 0  # Pages answered 200 (counted against the quota).
    truncated: bool = False  # Stopped at the caller's page limit with more pages left.


@dataclass(frozen=True)
class CallStats:
    """What one installation's calls have cost, as last reported by GitHub's headers."""

    calls: int = 0  # Requests that got an answer, whatever its status.
    transport_errors: int = 0  # Requests that got none.
    rate_limited: int = 0  # Answers that were rate-limit refusals.
    not_modified: int = 0  # 304 answers to conditional requests (not counted by GitHub).
    last_status: int | None = None
    last_call_at: float | None = None
    rate_limit_limit: int | None = None
    rate_limit_remaining: int | None = None
    rate_limit_used: int | None = None
    rate_limit_reset: float | None = None  # Epoch seconds.
    rate_limit_resource: str | None = None
