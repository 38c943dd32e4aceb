"""The project stands on its own (issue 7, item 9): nothing in it points at a file a clone
does not have, and its requirement IDs are explained in its own docs/requirements.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The session's shared folder, by its relative or its absolute path, and the files in it by
# name: a clone has none of them. Everywhere, tests included.
OUTSIDE = re.compile(
    r"\.\./shared|shared/(?:spec|github)/|(?<![\w>.-])/work/"
    r"|\b(?:DESIGN|STYLE|CHECKLIST|ENVIRONMENT|PEERS|NOTES|SOURCES)\.md\b"
)
# The shorthand for those files ("STYLE point 1", "STYLE 9", "PEERS 3", DESIGN "a section"). Outside
# tests/ only: tests/conftest.py still names its cast "(STYLE 10)" and is another change's file.
SHORTHAND = re.compile(r"\b(?:STYLE|PEERS)(?: point)? \d|\bDESIGN\b|\bCHECKLIST\b|design card")
ID_LINE = re.compile(r"^- \*\*([A-Z]+-\d{2})\*\* \((\w+)\) (\S.*)$")
APPS = {"zoomies_site", "accounts", "runners", "fleet", "capacity"}
TEXT_FILES = (".py", ".sh", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".html")
TEXT_NAMES = {".ci/run", "Makefile", "Dockerfile"}


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.split()


def pointing_outside(root: Path, paths: list[str]) -> list[str]:
    """`path:line: text` of every line that names a file outside the repository."""
    this = Path(__file__).relative_to(ROOT).as_posix()
    return [
        f"{path}:{number}: {line.strip()}"
        for path in paths
        if path != this
        and (path.endswith(TEXT_FILES) or Path(path).name in TEXT_NAMES)
        and (root / path).is_file()
        for number, line in enumerate((root / path).read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line) or (not path.startswith("tests/") and SHORTHAND.search(line))
    ]


def test_no_file_refers_to_a_path_outside_the_repository():
    assert pointing_outside(ROOT, tracked()) == []


def test_the_patterns_catch_an_outside_path_and_its_shorthand():
    assert OUTSIDE.search("numbered in `../shared/spec/CHECKLIST.md`")
    assert OUTSIDE.search("see /work/shared/DESIGN.md")
    assert OUTSIDE.search("as DESIGN.md says")
    assert OUTSIDE.search("(STYLE.md point 3)")
    assert OUTSIDE.search("GitHub never sends more (NOTES.md section 1)")
    assert OUTSIDE.search("PEERS.md point 7: GARM takes 5.8 s")
    assert not OUTSIDE.search("numbered in `docs/requirements.md`")
    assert not OUTSIDE.search("runners live in `<data dir>/agent/work/runners/`")
    assert SHORTHAND.search("state changes go through actions (STYLE point 1)")
    assert SHORTHAND.search("never sleep through a grace period (STYLE 9)")
    assert SHORTHAND.search('(ARCH-05, DESIGN "Which way imports run")')
    assert SHORTHAND.search("# PEERS 3: deregister at GitHub first")
    assert not SHORTHAND.search("the style of a page; RUN-07 and ARCH-05 stay")


def test_a_file_that_comes_back_to_an_outside_reference_is_reported(tmp_path):
    # The walk itself, not only the patterns: a production file and a test file, each with
    # one line that points outside, are both found; the shorthand only outside tests/.
    (tmp_path / "runners").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "runners" / "admin.py").write_text('"""Read-only (STYLE point 1)."""\n')
    (tmp_path / "tests" / "test_x.py").write_text("# see ../shared/DESIGN.md\n# (STYLE 10)\n")
    (tmp_path / "README.md").write_text("Fine.\nSee `DESIGN.md`.\n")
    found = pointing_outside(tmp_path, ["runners/admin.py", "tests/test_x.py", "README.md"])
    assert [entry.split(": ")[0] for entry in found] == [
        "runners/admin.py:1",
        "tests/test_x.py:1",
        "README.md:2",
    ]


def test_every_requirement_is_one_line_with_an_id_and_where_it_lives():
    lines = (ROOT / "docs" / "requirements.md").read_text().splitlines()
    entries = [m.groups() for line in lines if (m := ID_LINE.match(line))]
    ids = [entry[0] for entry in entries]
    assert len(ids) > 300 and len(ids) == len(set(ids))
    assert {app for _id, app, _text in entries} <= APPS
    # A line that starts like an entry but does not parse would be a silent gap.
    assert [line for line in lines if line.startswith("- **") and not ID_LINE.match(line)] == []
