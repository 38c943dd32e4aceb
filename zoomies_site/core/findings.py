"""What validation says about a configuration (CONF-03).

A finding is one named departure from a sound or safe configuration: a severity, a stable
key the UI and the system check can refer to, a title, why it matters and how to fix it. The
same list is printed at startup and shown in the problems drawer (CONF-05); an error stops
startup (CONF-04), a warning names a dangerous setting and lets the controller run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

ERROR: Literal["error"] = "error"
WARNING: Literal["warning"] = "warning"
Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    """One thing validation has to say, in the shape the problems drawer renders."""

    severity: Severity
    # Stable: "config.bind_without_tls", or "config.invalid_value:<setting>" for one subject.
    key: str
    title: str
    why: str
    fix: str

    def __post_init__(self) -> None:
        if self.severity not in (ERROR, WARNING):
            raise ValueError(f"finding severity must be error or warning, not {self.severity!r}")

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.severity}] {self.title} -- {self.why} Fix: {self.fix} ({self.key})"


def error(key: str, title: str, why: str, fix: str) -> Finding:
    return Finding(ERROR, key, title, why, fix)


def warning(key: str, title: str, why: str, fix: str) -> Finding:
    return Finding(WARNING, key, title, why, fix)


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == ERROR]


def warnings(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == WARNING]
