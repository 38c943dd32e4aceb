"""The labels a runner is registered with (issue: JIT runners carry what jobs ask for).

GitHub gives a JIT runner exactly the labels in the `generate-jitconfig` body and adds no
`self-hosted`, OS or architecture label of its own (only `config.sh` adds those), while jobs ask for
them (`runs-on: [self-hosted, linux, x64, gpu]`). The scheduler counts them as a pool's
labels (`runners.scheduler.matching.pool_label_set`), so the body must carry them too, or a
job is matched to a runner GitHub will never give it.

Pure: no I/O, no Django.
"""

from __future__ import annotations

from collections.abc import Iterable

from runners.scheduler.matching import parse_platform

# GitHub's spellings of the default labels (actions/runner VarUtil.cs).
OS_LABELS = {"linux": "Linux", "macos": "macOS", "windows": "Windows"}
ARCH_LABELS = {"x86": "X86", "x64": "X64", "arm": "ARM", "arm64": "ARM64"}


def runner_labels(labels: Iterable[str] | None, pool_name: str, platform: str | None) -> list[str]:
    """`self-hosted`, the pool's OS and architecture, its own labels and its name.

    The OS and architecture come from the pool's platform ("linux/x64"); a pool that names
    none gets neither, exactly as the scheduler matches it. Duplicates are dropped
    case-insensitively (GitHub's labels are), keeping the first spelling.
    """
    os_name, arch = parse_platform(platform)
    wanted = ["self-hosted"]
    if os_name:
        wanted.append(OS_LABELS.get(os_name, os_name))
    if arch:
        wanted.append(ARCH_LABELS.get(arch, arch))
    wanted += [label for label in (labels or []) if isinstance(label, str) and label.strip()]
    wanted.append(pool_name)
    out: list[str] = []
    seen: set[str] = set()
    for label in wanted:
        key = label.strip().lower()
        if key not in seen:
            seen.add(key)
            out.append(label.strip())
    return out
