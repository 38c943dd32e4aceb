"""agent.json: the only thing the agent keeps across a restart (AGENT-21, AGENT-22).

It holds the host id, the agent token, the controller URL and sha256 hashes of the join
tokens this host has spent, never a join token itself. A token minted from a claim code also
has when it expires and when the agent renews it (ESC-06), as the agent's own clock reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.agent.errors import AgentError

STATE_FILE = "agent.json"


class StateError(AgentError):
    """agent.json cannot be read or written, or forbids what was asked of it."""


class JoinTokenSpent(StateError):
    """The join token on offer was spent by this host before (AGENT-22)."""


def hash_join_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def normalise_url(url: str) -> str:
    return url.strip().rstrip("/")


@dataclass
class AgentState:
    """What agent.json holds; credentials are both-or-nothing."""

    host_id: int | None = None
    agent_token: str | None = None
    controller_url: str | None = None
    spent_join_token_hashes: list[str] = field(default_factory=list)
    agent_token_expires_at: float | None = None  # None: the token does not expire
    agent_token_renew_at: float | None = None

    def token_expired(self, now: float) -> bool:
        return self.agent_token_expires_at is not None and self.agent_token_expires_at <= now

    def has_credentials_for(self, controller_url: str) -> bool:
        return (
            self.host_id is not None
            and bool(self.agent_token)
            and normalise_url(self.controller_url or "") == normalise_url(controller_url)
        )

    def is_spent(self, join_token: str) -> bool:
        return hash_join_token(join_token) in self.spent_join_token_hashes

    def spend(self, join_token: str) -> None:
        digest = hash_join_token(join_token)
        if digest not in self.spent_join_token_hashes:
            self.spent_join_token_hashes.append(digest)

    def forget_credentials(self) -> None:
        # The spent hashes stay: they are what keeps a deleted host from re-offering its token.
        self.host_id = None
        self.agent_token = None
        self.agent_token_expires_at = self.agent_token_renew_at = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "host_id": self.host_id,
            "agent_token": self.agent_token,
            "controller_url": self.controller_url,
            "spent_join_token_sha256": list(self.spent_join_token_hashes),
        }
        if self.agent_token_expires_at is not None:  # only a token minted from a claim code
            data["agent_token_expires_at"] = self.agent_token_expires_at
            data["agent_token_renew_at"] = self.agent_token_renew_at
        return data


class StateStore:
    """Reads and atomically rewrites `<state_dir>/agent.json` (tmp file, fsync, rename, 0600)."""

    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE

    def load(self) -> AgentState:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return AgentState()
        except (OSError, ValueError) as exc:
            raise StateError(f"cannot read {self.path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise StateError(f"{self.path} does not hold a JSON object")
        host_id = raw.get("host_id")
        hashes = raw.get("spent_join_token_sha256") or []
        return AgentState(
            host_id=int(host_id) if host_id is not None else None,
            agent_token=raw.get("agent_token") or None,
            controller_url=raw.get("controller_url") or None,
            spent_join_token_hashes=[str(h) for h in hashes],
            agent_token_expires_at=_seconds(raw, "agent_token_expires_at", self.path),
            agent_token_renew_at=_seconds(raw, "agent_token_renew_at", self.path),
        )

    def save(self, state: AgentState) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n"
        # mkstemp creates the file 0600, so the token is never readable by others.
        fd, tmp = tempfile.mkstemp(prefix=".agent.json.", dir=self.state_dir)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def _seconds(raw: dict[str, Any], key: str, path: Path) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StateError(f"{path}: {key} must be a number of seconds, not {value!r}")
    return float(value)
