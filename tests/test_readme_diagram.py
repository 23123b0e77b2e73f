"""The README's diagram (section "How the pieces fit": from ``preprocess`` to a
kernel, each box a module) names only modules that exist.

The diagram is read as text: each region (export, run time, kernels, and
the lines naming the contract and pte_runner) starts at a header line and
has the directories its paths are relative to (``REGIONS``). Every name in
it that looks like a path, a file with a source extension (``plan.rs``,
``cpp/runner.cpp``), a directory (``step/``, ``fused/:``) or a pattern
(``*_recipes.rs``, ``ops_lowering/<kind>.py``), must match a file or
directory under one of its region's roots, or under a directory named
before it in the same region (``fused/: compiled.rs``,
``conv1d/prepared.rs`` then ``depthwise/``). A name that matches nothing,
a module renamed or gone, fails the test.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Header (the start of the stripped line, up to the names it holds) ->
# the directories, relative to the repository, its names are relative to.
REGIONS = {
    "export:": ["partitioner_py/rustconv/export", "partitioner_py/rustconv"],
    "│ contract:": ["."],
    "run time (delegate/src):": ["delegate/src", "delegate"],
    "kernels (kernels/src)": ["kernels/src"],
    "pte_runner/": [".", "pte_runner"],
}

_PART = r"[\w*<>-]+"
# A file with a source extension, or a directory (a trailing slash followed
# by a space, a colon, a parenthesis, a comma or the line's end: not the
# "in/out" of prose).
NAME = re.compile(
    rf"(?<![\w./])(?:(?:{_PART}/)*{_PART}\.(?:py|rs|fbs|md|cpp)(?![\w.])"
    rf"|(?:{_PART}/)+(?=[\s:),]|$))"
)


def diagram(readme: str) -> list[str]:
    """The lines of the first code block after the "How the pieces fit"
    heading."""
    section = readme.split("## How the pieces fit", 1)[1]
    return section.split("```", 2)[1].splitlines()[1:]


def names_by_region(lines: list[str]) -> list[tuple[str, str]]:
    """(region header, name) for each path-like name, in reading order."""
    found = []
    region = None
    for line in lines:
        text = line.strip()
        for header in REGIONS:
            if text.startswith(header):
                region = header
                text = text[len(header) :]
                break
        if region is None:
            continue
        found.extend((region, m.group(0)) for m in NAME.finditer(text))
    return found


def _matches(base: Path, name: str) -> list[Path]:
    pattern = re.sub(r"<\w+>", "*", name.rstrip("/"))
    return [p for p in base.glob(pattern) if p.is_dir() or not name.endswith("/")]


def missing(lines: list[str], root: Path = ROOT) -> list[str]:
    """The names of the diagram that match nothing (see the module docs)."""
    gone = []
    bases: dict[str, list[Path]] = {h: [root / d for d in dirs] for h, dirs in REGIONS.items()}
    for region, name in names_by_region(lines):
        hits = [hit for base in bases[region] for hit in _matches(base, name)]
        if not hits:
            gone.append(f"{region} {name}")
            continue
        # A directory named here is a base for the names after it.
        parent = name if name.endswith("/") else name.rpartition("/")[0]
        if parent:
            for hit in hits:
                directory = hit if name.endswith("/") else hit.parent
                if directory not in bases[region]:
                    bases[region].append(directory)
    return gone


def test_the_diagram_names_only_modules_that_exist():
    lines = diagram(README.read_text())
    names = names_by_region(lines)
    # Every region was found and read (a header changed fails here, not by
    # checking nothing).
    assert {region for region, _ in names} == set(REGIONS)
    assert len(names) >= 40, names
    assert missing(lines) == []


def test_a_module_gone_fails():
    lines = diagram(README.read_text())
    renamed = [line.replace("plan.rs", "planner.rs") for line in lines]
    assert missing(renamed) == ["run time (delegate/src): planner.rs"]
    moved = [line.replace("fused/:", "fusing/:") for line in lines]
    assert "kernels (kernels/src) fusing/" in missing(moved)
    no_kind = [line.replace("<kind>.py", "<kind>.rs") for line in lines]
    assert missing(no_kind) == ["export: ops_lowering/<kind>.rs"]
