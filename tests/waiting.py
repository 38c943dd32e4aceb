"""The suite's one way to wait for something (issue 22 item 6): poll a predicate until it
is truthy, with a deadline, instead of sleeping for a guessed time. Every other waiting
helper in the tests is this one under the name its callers know."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "",
    *,
    every: float = 0.02,
    tolerate: tuple[type[BaseException], ...] = (),
) -> Any:
    """`predicate()`'s first truthy value; AssertionError naming `what` once `timeout`
    seconds pass. An exception in `tolerate` counts as "not yet" (a server still starting)
    and is named in the failure."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
        except tolerate as exc:
            last_error, value = exc, None
        if value:
            return value
        if time.monotonic() >= deadline:
            why = f" ({last_error!r})" if last_error is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}{why}")
        time.sleep(every)
