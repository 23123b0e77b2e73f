"""``rustconv.export.ops_lowering`` registers every op module in its folder.

The package imports its modules by listing its folder, so adding an op kind is
its module file and nothing else in the package: these tests read the folder
and the classes independently of that listing, so a module it skipped, or a
lowering class defined without ``@register``, fails here rather than as an op
the partitioner silently leaves to the next backend.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import rustconv.export.ops_lowering as ops_lowering
from rustconv.export.ops_lowering import OpLowering, registered


def test_every_module_file_of_the_package_is_imported():
    folder = Path(ops_lowering.__file__).parent
    files = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    assert {"conv", "scan", "unary", "evaluators"} <= files
    imported = {name.rpartition(".")[2] for name in ops_lowering.MODULES}
    assert imported == files
    assert list(ops_lowering.MODULES) == sorted(ops_lowering.MODULES)
    assert all(name in sys.modules for name in ops_lowering.MODULES)


def test_every_lowering_class_of_the_package_is_registered():
    """Every class claiming targets, that is (a shared base such as norm's
    ``_TupleNorm`` claims none)."""
    defined = {
        cls
        for name in ops_lowering.MODULES
        for _, cls in inspect.getmembers(sys.modules[name], inspect.isclass)
        if issubclass(cls, OpLowering) and cls.__module__ == name and tuple(cls.targets)
    }
    lowerings = {type(lowering) for lowering in registered()}
    assert defined, "no OpLowering subclass found: the walk looked in the wrong place"
    assert defined - lowerings == set(), "defined without @register"
    assert lowerings - defined == set(), "registered from outside the package"
