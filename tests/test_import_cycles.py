"""The rustconv package has no import cycles, function-level imports included.

The module import graph is built from the source (``ast``, nothing is
imported): an edge for every ``import`` / ``from ... import`` anywhere in a
module (module level, functions, methods), to the most specific module of
the package it names (``from rustconv.export import blob`` names
``rustconv.export.blob``). Two kinds of import are not edges: those under
``if TYPE_CHECKING:`` (never executed; annotations only), and the implicit
import of a module's parent packages (every ``rustconv.x.y`` runs
``rustconv/__init__.py``; counting it would make every module a cycle with
the package's public surface). A package that imports its modules by
discovering them (``pkgutil.iter_modules(__path__)``, as ``ops_lowering``
does) imports each module in its folder. Any strongly connected component of
more than one module, or a module importing itself, fails the test.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "partitioner_py" / "rustconv"


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(
    name: str, path: Path, is_package: bool, known: set[str], type_checking: bool = False
) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its body
    (``type_checking``: those under ``if TYPE_CHECKING:`` too)."""

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(filter(None, (owner(alias.name) for alias in child.names)))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (child.level - 1)]
                    base = ".".join([*here, base] if base else here)
                for alias in child.names:
                    target = f"{base}.{alias.name}"
                    found.update(filter(None, [owner(target if target in known else base)]))
            visit(child)

    tree = ast.parse(path.read_text(), str(path))
    visit(tree)
    if is_package and _discovers_its_modules(tree):
        found.update(m for m in known if m.rpartition(".")[0] == name)
    return found


def _discovers_its_modules(tree: ast.AST) -> bool:
    """Whether a package's ``__init__`` lists its own folder's modules
    (``pkgutil.iter_modules(__path__)``), to import each."""
    return any(
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "iter_modules"
        and any(isinstance(arg, ast.Name) and arg.id == "__path__" for arg in call.args)
        for call in ast.walk(tree)
    )


def import_graph(package: Path = PACKAGE, type_checking: bool = False) -> dict[str, set[str]]:
    found = modules(package)
    return {
        name: imports(name, path, is_package, set(found), type_checking)
        for name, (path, is_package) in found.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and self-loops
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["e"]]


def test_the_graph_sees_function_level_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .. import a\nif TYPE_CHECKING:\n    import pkg.c\n"
    )
    (package / "c.py").write_text("from pkg.sub.b import x\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["pkg.c"] == {"pkg.sub.b"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_the_graph_sees_modules_a_package_discovers(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import importlib, pkgutil\n"
        "for info in pkgutil.iter_modules(__path__):\n"
        "    importlib.import_module(f'{__name__}.{info.name}')\n"
    )
    (package / "a.py").write_text("import pkg\n")
    (package / "b.py").write_text("")
    graph = import_graph(package)
    assert graph["pkg"] == {"pkg.a", "pkg.b"}
    assert cycles(graph) == [["pkg", "pkg.a"]]


def test_rustconv_has_no_import_cycles():
    graph = import_graph()
    assert "rustconv.export.partitioner" in graph and "rustconv.guided" in graph
    assert "rustconv.export.partitioner" in graph["rustconv.guided"]
    assert "rustconv.export.ops_lowering.conv" in graph["rustconv.export.ops_lowering"]
    assert cycles(graph) == []


def test_rustconv_has_no_import_cycles_in_annotations_either():
    """The imports made for annotations only close no circle either: the op
    lowerings annotate with the ``Builder`` protocol
    (``rustconv.export.ops_lowering.builder``), not with the
    ``LoweringBuilder`` of ``rustconv.export.lowering``, which imports them."""
    graph = import_graph(type_checking=True)
    assert "rustconv.export.lowering" not in graph["rustconv.export.ops_lowering.conv"]
    assert cycles(graph) == []
