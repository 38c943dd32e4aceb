"""One log line per change of a known fault, not a traceback per try (issue 21 item 22).

A read-only or locked database for 30 s wrote 104 tracebacks: every periodic job, every
relay tick, each a full stack for a fault whose cause is one sentence and which the
controller already reports (the degraded marker, /healthz, the problems list). A loop that
retries keeps a `FaultLog`: the first failure of a run of known faults is one warning line
without a stack, the retries are debug, and the first success after them says so once. A
fault that is not the database's state (a bug of ours, a bad row) still logs its traceback
every time: those are the ones someone must read.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError

# The database's own state (locked, read-only, gone, restarted), not a fault of the code.
KNOWN_FAULTS = (OperationalError, InterfaceError)


class FaultLog:
    """The log of one retrying loop (`what` names it in each line)."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self.failures = 0

    def failed(self, exc: BaseException) -> None:
        """Call from the `except` block of a failed try."""
        if not isinstance(exc, KNOWN_FAULTS):
            self.log.exception("%s failed", self.what)
            return
        self.failures += 1
        if self.failures == 1:
            self.log.warning(
                "%s failed: the database refused (%s); retrying, quietly until it works",
                self.what,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
        else:
            self.log.debug("%s failed again (%d): %s", self.what, self.failures, exc)

    def worked(self) -> None:
        """Call after a try that succeeded."""
        if self.failures:
            self.log.warning("%s works again after %d failed tries", self.what, self.failures)
            self.failures = 0
