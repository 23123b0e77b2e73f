"""Counts import circles between the modules of a Rust crate: modules that
refer to each other in a loop (issue 17's "Done means": none in delegate/src).

    scripts/import_cycles.py [--max N] [--verbose] CRATE_SRC...

Each CRATE_SRC is a crate's source directory (holding lib.rs or main.rs).
A module is a file (``foo.rs``, ``foo/mod.rs``) or an inline ``mod foo { }``.
Module A refers to module B when A's code names a path into B: a ``use``
(groups, globs and ``pub use`` included) or a path written in code
(``crate::threads::is_worker()``, ``super::Foo``, ``child::bar``), resolved
to the deepest module the path names; comments and string literals are
ignored. A circle is an elementary cycle of that graph (``a -> b -> a`` is
one, ``a -> b -> c -> a`` another). Prints each circle and the count per
crate; exits 1 when a crate has more than ``--max`` (default 0).

Cheap (a few milliseconds) and run by scripts/test.sh, so a circle that
comes back fails the test command.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

Module = tuple[str, ...]


def strip_comments_and_strings(text: str) -> str:
    """``text`` with comments and string/char literals blanked (newlines kept),
    so that neither a doc link nor a message is taken for a path."""
    out: list[str] = []
    i, n = 0, len(text)

    def blank(s: str) -> str:
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 2)
                j = n if j < 0 else j + 1
            elif i + 2 < n and text[i + 2] == "'":
                j = i + 3
            else:
                out.append(c)
                i += 1
                continue
            out.append(blank(text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use_tree(tree: str) -> list[list[str]]:
    """The paths one ``use`` tree names: ``a::{b, c::{self, D}}`` ->
    ``a::b``, ``a::c``, ``a::c::D`` (renames and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)

    def parse(s: str, prefix: list[str]) -> list[list[str]]:
        # Split s at top-level commas.
        parts, depth, start = [], 0, 0
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        parts.append(s[start:])
        paths = []
        for part in filter(None, parts):
            brace = part.find("{")
            if brace >= 0:
                head = [seg for seg in part[:brace].split("::") if seg]
                paths += parse(part[brace + 1 : part.rindex("}")], prefix + head)
                continue
            part = re.sub(r"as\w+$", "", part) if "as" in part else part
            segs = [seg for seg in part.split("::") if seg and seg != "*"]
            if segs == ["self"]:
                segs = []
            paths.append(prefix + segs)
        return paths

    return parse(tree, [])


TOKENS = re.compile(
    r"(?P<use>\buse\s+(?P<tree>[^;]+);)"
    r"|(?P<mod>\bmod\s+(?P<name>\w+)\s*(?P<kind>[;{]))"
    r"|(?P<open>\{)|(?P<close>\})"
    r"|(?P<path>\b\w+(?:\s*::\s*\w+)+)"
)


class Crate:
    def __init__(self, src: Path):
        self.src = src
        self.modules: dict[Module, str] = {}  # module -> comment-free code
        self.edges: dict[Module, set[Module]] = {}
        root = src / "lib.rs" if (src / "lib.rs").exists() else src / "main.rs"
        self._load((), root)
        for module in list(self.modules):
            self.edges.setdefault(module, set())
        for module, code in list(self._file_modules.items()):
            self._references(module, code)

    def _load(self, module: Module, path: Path) -> None:
        """Reads the file of ``module`` and, through its ``mod x;`` items,
        every file module below it."""
        self._file_modules = getattr(self, "_file_modules", {})
        code = strip_comments_and_strings(path.read_text())
        self._file_modules[module] = code
        self.modules[module] = str(path.relative_to(self.src))
        child_dir = (
            path.parent if path.name in ("lib.rs", "main.rs", "mod.rs") else (path.with_suffix(""))
        )
        stack: list[tuple[str, int]] = []
        depth = 0
        for m in TOKENS.finditer(code):
            if m.group("open"):
                depth += 1
            elif m.group("close"):
                depth -= 1
                while stack and stack[-1][1] > depth:
                    stack.pop()
            elif m.group("mod"):
                here = module + tuple(name for name, _ in stack)
                child = here + (m.group("name"),)
                if m.group("kind") == "{":
                    depth += 1
                    stack.append((m.group("name"), depth))
                    self.modules[child] = f"{self.modules[module]}::{m.group('name')}"
                elif not stack:
                    name = m.group("name")
                    file = child_dir / f"{name}.rs"
                    if not file.exists():
                        file = child_dir / name / "mod.rs"
                    self._load(child, file)
                # An out-of-line `mod x;` inside an inline module is not used here.

    def _references(self, module: Module, code: str) -> None:
        stack: list[tuple[str, int]] = []
        depth = 0
        for m in TOKENS.finditer(code):
            here = module + tuple(name for name, _ in stack)
            if m.group("open"):
                depth += 1
            elif m.group("close"):
                depth -= 1
                while stack and stack[-1][1] > depth:
                    stack.pop()
            elif m.group("mod"):
                if m.group("kind") == "{":
                    depth += 1
                    stack.append((m.group("name"), depth))
            elif m.group("use"):
                for path in expand_use_tree(m.group("tree")):
                    self._edge(here, path, bare_ok=True)
            elif m.group("path"):
                segs = [s.strip() for s in m.group("path").split("::")]
                self._edge(here, segs, bare_ok=True)

    def _edge(self, here: Module, segs: list[str], bare_ok: bool) -> None:
        if not segs:
            return
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] in ("self", "super"):
            base = here
            rest = segs
            while rest and rest[0] in ("self", "super"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
        elif bare_ok and here + (segs[0],) in self.modules:
            base, rest = here, segs
        else:
            return  # an external crate, a type's associated item, a local
        target = base
        for seg in rest:
            if target + (seg,) in self.modules:
                target = target + (seg,)
            else:
                break
        if target != here:
            self.edges[here].add(target)

    def name(self, module: Module) -> str:
        return "::".join(("crate",) + module)


def elementary_cycles(edges: dict[Module, set[Module]]) -> list[list[Module]]:
    """Every elementary cycle, each once, started at its least node."""
    order = sorted(edges)
    index = {v: k for k, v in enumerate(order)}
    cycles = []
    for start in order:
        # Paths from start through nodes greater than start, back to start.
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        on_path = {start}
        while stack:
            node, succs = stack[-1]
            advanced = False
            for nxt in succs:
                if nxt == start:
                    cycles.append(list(path))
                elif index[nxt] > index[start] and nxt not in on_path:
                    stack.append((nxt, iter(sorted(edges[nxt]))))
                    path.append(nxt)
                    on_path.add(nxt)
                    advanced = True
                    break
            if not advanced:
                stack.pop()
                on_path.discard(path.pop())
    return cycles


def tangles(edges: dict[Module, set[Module]]) -> list[list[Module]]:
    """The strongly connected components of more than one module: each is a
    set of modules every one of which reaches every other (Tarjan)."""
    index: dict[Module, int] = {}
    low: dict[Module, int] = {}
    stack: list[Module] = []
    on_stack: set[Module] = set()
    found = []

    def visit(v: Module) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="+", type=Path)
    parser.add_argument("--max", type=int, default=0, help="circles allowed per crate")
    parser.add_argument("--verbose", action="store_true", help="print the module graph too")
    args = parser.parse_args()
    failed = False
    for src in args.src:
        crate = Crate(src)
        if args.verbose:
            for module in sorted(crate.edges):
                targets = ", ".join(crate.name(t) for t in sorted(crate.edges[module]))
                print(f"  {crate.name(module)} -> {targets}")
        cycles = elementary_cycles(crate.edges)
        for cycle in cycles:
            print(f"  circle: {' -> '.join(crate.name(m) for m in cycle + cycle[:1])}")
        for tangle in tangles(crate.edges):
            print(f"  tangle of {len(tangle)}: {', '.join(crate.name(m) for m in tangle)}")
        print(f"{src}: {len(crate.modules)} modules, {len(cycles)} import circles")
        failed |= len(cycles) > args.max
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
