"""A pool row as the scheduler's `PoolView`, or why it cannot be read (issue 8 item 1).

Pools are validated when they are written (`runners.models.pool_errors`), but a row can
still be unreadable: written before that validation existed, by hand in the database, or
by a future bug. The reconcile pass must never stop the whole fleet over one such row, so
it reads each pool through `read_pools`, skips the ones it cannot read, and the problems
list (runners.problems) names them, worked out the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from runners.scheduler import PoolView


class PoolUnreadable(ValueError):
    """The row's values are not of the shape the scheduler reads."""


@dataclass(frozen=True)
class Unreadable:
    """A pool the reconcile pass skipped, and why."""

    pool_id: int
    name: str
    reason: str


def _labels(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PoolUnreadable(f"labels is not a list of strings: {value!r:.80}")
    return tuple(value)


def _selector(value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise PoolUnreadable(
            f"host_selector is a {type(value).__name__}, not a mapping of label to value"
        )
    pairs = []
    for key, item in value.items():
        # Numbers read as their text (an older admin stored {"gpus": 2}); nothing nested.
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise PoolUnreadable(f"host_selector value for {key!r} is not a string")
        pairs.append((str(key), str(item)))
    return tuple(sorted(pairs))


def _positive(value: Any, what: str) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PoolUnreadable(f"{what} is not a number")
    if not math.isfinite(value) or value <= 0:
        raise PoolUnreadable(f"{what} is {value}, not a positive number")
    return value


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PoolUnreadable(f"{what} is {value!r}, not a count")
    return value


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PoolUnreadable(f"{what} is not a string")
    return value


def pool_view(p: Any) -> PoolView:
    """The scheduler's view of pool row `p`; PoolUnreadable when a field has the wrong shape."""
    idle = p.idle_timeout
    if idle is not None and not isinstance(idle, timedelta):
        raise PoolUnreadable("idle_timeout is not a duration")
    return PoolView(
        id=p.pk,
        name=p.name,
        labels=_labels(p.labels),
        backend=_text(p.backend, "backend"),
        platform=_text(p.platform, "platform") or None,
        host_selector=_selector(p.host_selector),
        image=_text(p.image, "image"),
        cpus=_positive(p.cpus, "cpus"),
        memory_mb=_positive(p.memory_mb, "memory_mb"),
        dind=bool(p.dind),
        ephemeral=bool(p.ephemeral),
        warm=_count(p.warm, "warm"),
        max_runners=_count(p.max_runners, "max_runners"),
        # An automatic pool with no host left (SCHED-29) is kept but given no runner.
        paused=bool(p.paused) or (p.auto_key is not None and not p.auto_active),
        idle_timeout=idle,
        installation_id=p.installation_id,
    )


def read_pools(rows: Iterable[Any]) -> tuple[tuple[PoolView, ...], tuple[Unreadable, ...]]:
    """The pools the scheduler can read, and the ones it cannot, with why."""
    views, skipped = [], []
    for row in rows:
        try:
            views.append(pool_view(row))
        except PoolUnreadable as exc:
            skipped.append(Unreadable(row.pk, str(row.name), str(exc)))
    return tuple(views), tuple(skipped)
