"""A progress bar for long copies, drawn only when the output is a terminal."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

MIB = 1024 * 1024


class Progress:
    """Call with each chunk's size; redraws at most ten times a second, and only on a TTY.

    boto3 calls it from its transfer threads, hence the lock.
    """

    def __init__(self, label: str, total: int, stream: TextIO | None, width: int = 30):
        self.label, self.total, self.stream, self.width = label, max(total, 1), stream, width
        self.done = 0
        self._drawn = 0.0
        self._lock = threading.Lock()
        self.enabled = bool(stream is not None and getattr(stream, "isatty", lambda: False)())

    def __call__(self, size: int) -> None:
        with self._lock:
            self.done += size
            if not self.enabled:
                return
            now = time.monotonic()
            if now - self._drawn < 0.1 and self.done < self.total:
                return
            self._drawn = now
            self.stream.write(self.render() + "\r")  # type: ignore[union-attr]
            self.stream.flush()  # type: ignore[union-attr]

    def render(self) -> str:
        share = min(self.done / self.total, 1.0)
        filled = int(share * self.width)
        return (
            f"{self.label} [{'#' * filled}{' ' * (self.width - filled)}] {share:4.0%} "
            f"{self.done / MIB:.1f}/{self.total / MIB:.1f} MiB"
        )

    def finish(self) -> None:
        if self.enabled:
            self.stream.write(self.render() + "\n")  # type: ignore[union-attr]
            self.stream.flush()  # type: ignore[union-attr]


@contextmanager
def watching(path: Path, progress: Progress, every: float = 0.2) -> Iterator[None]:
    """Feed `progress` with the growth of a file something else is writing (SQLite's
    `VACUUM INTO` reports nothing while it copies), looked at every `every` seconds and
    once more at the end."""
    stop = threading.Event()
    seen = 0

    def look() -> None:
        nonlocal seen
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size > seen:
            progress(size - seen)
            seen = size

    def loop() -> None:
        while not stop.wait(every):
            look()

    watcher = threading.Thread(target=loop, name=f"progress {path.name}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        look()
