"""The one reader of what a pure module imports and calls (issue 22 item 6): each pure
decision (the scheduler, the capacity and machine planners, the throttle, the memory
planner, the redelivery and backup plans, the share arithmetic, the provider contract) is
held to the imports it may make, and none of them may read a clock, by these two helpers.
A whitelist, which an import-linter contract (a blacklist) could not be: a module that
starts using `socket` or `sqlite3` fails here without anyone listing those first."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

# A clock read by attribute (`datetime.now()`, `time.monotonic()`, `date.today()`, ...).
CLOCK_ATTRS = frozenset({
    "now", "utcnow", "today", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
    "time_ns", "process_time",
})  # fmt: skip
# Calls that reach outside the process or around the import rules.
BANNED_CALLS = frozenset({"__import__", "open", "eval", "exec"})


def imports_of(source: str) -> set[str]:
    """Every module `source` imports (a relative import as its dots and name)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def clock_and_banned_calls(source: str, filename: str = "") -> list[str]:
    """Every clock read or banned call in `source`, as "file:line: what"."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        where, func = f"{filename}:{node.lineno}", node.func
        if isinstance(func, ast.Attribute) and (
            func.attr in CLOCK_ATTRS or (func.attr == "time" and isinstance(func.value, ast.Name))
        ):
            found.append(f"{where}: clock call .{func.attr}()")
        elif isinstance(func, ast.Name) and func.id in BANNED_CALLS | CLOCK_ATTRS:
            found.append(f"{where}: call {func.id}()")
    return found


def impurities(path: Path, allowed: Iterable[str], *, own_package: str | None = None) -> list[str]:
    """What in the module at `path` breaks purity (see `impurities_in`)."""
    return impurities_in(path.read_text(), path.name, allowed, own_package=own_package)


def impurities_in(
    source: str, filename: str, allowed: Iterable[str], *, own_package: str | None = None
) -> list[str]:
    """An import outside `allowed` (a package's own modules may import each other, and a
    relative import stays inside it only from its top level), a clock read, a banned call:
    each as "file: what"."""
    permitted = set(allowed)
    bad = []
    for module in sorted(imports_of(source)):
        if module.startswith("."):
            dots = len(module) - len(module.lstrip("."))
            if own_package is None or dots > 1:
                bad.append(f"{filename}: relative import {module}")
            continue
        inside = own_package is not None and (
            module == own_package or module.startswith(own_package + ".")
        )
        if module not in permitted and not inside:
            bad.append(f"{filename}: imports {module}")
    return bad + clock_and_banned_calls(source, filename)
