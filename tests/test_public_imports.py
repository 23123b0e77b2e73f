"""Every public import path the documentation shows still resolves.

The package was split by role (export, runtime, devtools, guided, examples);
what users already write keeps working through the old paths' thin
re-exports. The paths are read from the documentation itself (README.md,
bench/README.md, schema/README.md, docs/), so a path documented later is
checked too: ``from rustconv... import names``, ``import rustconv...``,
``python -m rustconv...`` and dotted references such as
``rustconv.testing.check_others_unchanged``. The ``-m`` commands themselves
run in tests/test_inspect.py and tests/test_profiling.py (and the wheel's
smoke test).
"""

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "schema" / "README.md"]
DOCS += sorted((ROOT / "docs").rglob("*.md"))
#: Dotted names in the docs that are not Python paths: the schema file, a torch op overload.
NOT_PYTHON = {"rustconv.fbs", "rustconv.linear_scan.default"}

#: Old top-level module -> where it lives now (each re-exports its ``__all__``).
MOVED = {
    "rustconv.partitioner": "rustconv.export.partitioner",
    "rustconv.backend": "rustconv.export.backend",
    "rustconv.support": "rustconv.export.support",
    "rustconv.inspect": "rustconv.devtools.inspect",
    "rustconv.profile": "rustconv.devtools.profile",
    "rustconv.profiling": "rustconv.devtools.trace",
    "rustconv.testing": "rustconv.devtools.testing",
    "rustconv.reference": "rustconv.devtools.reference",
    "rustconv.blocks": "rustconv.examples.blocks",
}


def _documented() -> tuple[set[tuple[str, str]], set[str], set[str]]:
    imports, modules, dotted = set(), set(), set()
    for doc in DOCS:
        text = doc.read_text()
        for module, names in re.findall(r"from (rustconv[\w.]*) import ([\w, ]+)", text):
            imports.update((module, n.strip()) for n in names.split(",") if n.strip())
        modules.update(re.findall(r"import (rustconv[\w.]*)", text))
        modules.update(re.findall(r"-m (rustconv[\w.]*)", text))
        dotted.update(re.findall(r"`(rustconv\.[\w.]*\w)", text))
    return imports, modules, dotted - NOT_PYTHON


IMPORTS, MODULES, DOTTED = _documented()


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(1, len(parts) + 1)[::-1]:
        name = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent that is a module, not a package
            found = False
        if found:
            obj = importlib.import_module(name)
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            return obj
    raise ImportError(dotted)


def test_the_docs_show_the_paths_users_write():
    # The reading of the docs finds what it must (else the tests below check nothing).
    assert ("rustconv", "RustConvPartitioner") in IMPORTS
    assert ("rustconv.guided", "GuidedPartitioner") in IMPORTS
    assert {"rustconv.runtime", "rustconv.inspect", "rustconv.profile"} <= MODULES
    assert "rustconv.testing.check_others_unchanged" in DOTTED


@pytest.mark.parametrize("module,name", sorted(IMPORTS))
def test_documented_from_import(module, name):
    assert getattr(importlib.import_module(module), name) is not None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_documented_module(module):
    imported = importlib.import_module(module)
    if module in ("rustconv.inspect", "rustconv.profile"):
        # python -m runs them: their main is the devtools command's.
        assert imported.main is importlib.import_module(MOVED[module]).main


@pytest.mark.parametrize("dotted", sorted(DOTTED))
def test_documented_dotted_name(dotted):
    _resolve(dotted)


def test_package_surface():
    import rustconv

    for name in rustconv.__all__:
        assert getattr(rustconv, name) is not None, name
    from rustconv.export.backend import RustConvBackend
    from rustconv.export.partitioner import RustConvPartitioner

    assert rustconv.RustConvPartitioner is RustConvPartitioner
    assert rustconv.RustConvBackend is RustConvBackend


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_old_module_re_exports_the_new_one(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    assert old_module.__all__ == new_module.__all__
    for name in new_module.__all__:
        assert getattr(old_module, name) is getattr(new_module, name), f"{old}.{name}"


def test_one_backend_id():
    """``"RustConvBackend"`` is defined once (rustconv.backend_id) and is the
    name every part of the package uses."""
    import rustconv.runtime
    from rustconv.backend_id import BACKEND_ID
    from rustconv.devtools import inspect, testing, trace
    from rustconv.export.backend import RustConvBackend
    from rustconv.export.partitioner import RustConvPartitioner

    assert BACKEND_ID == RustConvBackend.__name__ == "RustConvBackend"
    assert RustConvPartitioner().delegation_spec.backend_id == BACKEND_ID
    assert rustconv.runtime.BACKEND_NAME is BACKEND_ID
    assert inspect.BACKEND_ID is trace.BACKEND_ID is testing.BACKEND_ID is BACKEND_ID
    package = ROOT / "partitioner_py" / "rustconv"
    defined = [
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if re.search(r"""^\w+\s*=\s*["']RustConvBackend["']""", p.read_text(), re.M)
    ]
    assert defined == ["backend_id.py"], defined
