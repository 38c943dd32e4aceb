"""The one way configuration is read from the process environment.

A variable, or, when it is empty or unset, the file its `<NAME>_FILE` twin names (a Docker or
systemd secret). Django's process settings (`zoomies_site.settings`) and the registry's
environment layer both read through here; nothing else reads `ZOOMIES_*` variables.
Imports nothing of Django, so `settings.py` can use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvValue:
    """A value and where it came from: `NAME`, `NAME_FILE`, or "" when neither is set.

    `path` is the file's path when the value came from `NAME_FILE`, so a message can name it.
    """

    text: str
    source: str
    path: str = ""

    def __bool__(self) -> bool:
        return bool(self.source)


UNSET = EnvValue("", "")


def lookup(name: str, env: Mapping[str, str] | None = None, *, file: bool = True) -> EnvValue:
    """`name`'s value, else (with `file`) the text of the file `name_FILE` names.

    An empty variable counts as unset. The file's text is returned as it is (a list secret
    reads one item per line); OSError when the named file cannot be read.
    """
    env = os.environ if env is None else env
    value = env.get(name)
    if value:
        return EnvValue(value, name)
    path = env.get(f"{name}_FILE") if file else None
    if not path:
        return UNSET
    return EnvValue(Path(path).read_text(), f"{name}_FILE", path)


def read(name: str, default: str = "", *, file: bool = False) -> str:
    """A process-level variable's value (stripped when it came from a file), or `default`."""
    found = lookup(name, file=file)
    if not found:
        return default
    return found.text.strip() if found.source != name else found.text
