"""A database that stalls or turns read-only is a degraded state, not an exit (issue 11
item 5).

The controller probes a write (its lease renewal) on a fresh connection every renewal
interval. When that fails with a database error it writes a small marker file beside the
data (the database itself cannot take it), keeps running, and removes the marker as soon as
a write goes through again. `/healthz` and the problems list read the marker, so a probe
or an operator sees `degraded` with the reason while the controller waits it out.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from django.conf import settings

PROBLEM_KEY = "database.unwritable"


def marker_path() -> Path:
    return Path(settings.DATA_DIR) / "database-degraded.json"


def mark_degraded(*, error: str, now: datetime) -> None:
    """Record (or refresh) the degraded state; `since` stays the first failure's time."""
    path = marker_path()
    current = read()
    since = current["since"] if current else now.isoformat()
    body = {"problem": PROBLEM_KEY, "since": since, "checked_at": now.isoformat()}
    body["error"] = error[:500]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)  # a reader never sees half a marker


def clear() -> bool:
    """The database takes writes again; True when a degraded state ended here."""
    try:
        marker_path().unlink()
    except FileNotFoundError:
        return False
    return True


def read() -> dict | None:
    try:
        body = json.loads(marker_path().read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def problems() -> list[dict]:
    """The problems-list entry while degraded."""
    state = read()
    if state is None:
        return []
    return [
        {
            "key": PROBLEM_KEY,
            "severity": "error",
            "title": "The database does not take writes",
            "detail": (
                f"Since {state.get('since', '?')} the controller's writes fail "
                f"({state.get('error', '')}). It keeps running and resumes by itself once "
                "the database takes writes again; check the disk, its permissions and any "
                "process holding the database's write lock."
            ),
        }
    ]
