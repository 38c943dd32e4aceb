"""Small helpers for the reason sentences every action carries (SCHED-03)."""

from __future__ import annotations

from datetime import timedelta


def duration(span: timedelta) -> str:
    """A compact human duration: "20m", "1h30m", "10s", "2m30s", "<1s"."""
    total = int(span.total_seconds())
    if total <= 0:
        return "<1s" if span > timedelta(0) else "0s"
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    return "".join(f"{value}{unit}" for value, unit in parts if value)


def count(number: int, noun: str, plural: str | None = None) -> str:
    """ "1 job", "2 jobs"."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"
