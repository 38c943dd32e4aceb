"""The fake GitHub server and the fake runner, for tests, benchmarks and the sandbox.

`FakeGitHub` is imported lazily so that the fake runner (`python -m
runners.github.fake.runner`), which lives in this package, starts without loading the
server's dependencies (PyJWT, cryptography).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runners.github.fake.server import FakeGitHub

__all__ = ["FakeGitHub"]


def __getattr__(name: str) -> Any:
    if name == "FakeGitHub":
        # On first use only: the fake runner in this package must start without PyJWT.
        from runners.github.fake.server import FakeGitHub  # noqa: PLC0415

        return FakeGitHub
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
