"""The ``pte_runner`` command of an installed wheel.

The native runner is ``rustconv/bin/pte_runner`` inside the package; its
RUNPATH finds the executorch package beside it in site-packages. This
launcher checks that the installed executorch is the one it was built for,
puts that executorch's ``lib/`` on ``LD_LIBRARY_PATH`` (so environments where
executorch lives elsewhere on ``sys.path`` work too: a ``--user`` install, a
layered venv), names this interpreter's shared libpython in
``RUSTCONV_LIBPYTHON`` (ExecuTorch's LLM custom ops library needs CPython's
symbols; the runner's default is the build machine's), then replaces itself
with the binary, so flags, output and exit status are the runner's own
(README: pte_runner). A source checkout runs ``target/release/pte_runner``
directly.

It is a module of its own, outside ``rustconv``, because importing that
package imports torch (seconds), and it loads ``rustconv/native.py`` (the
version check, standard library only) by path for the same reason.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

__all__ = ["package_dir", "executorch_lib", "libpython", "main"]


def package_dir() -> Path:
    """The installed ``rustconv`` package, found without importing it."""
    spec = importlib.util.find_spec("rustconv")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("pte_runner: error: the rustconv package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _native(package: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_rustconv_native", package / "native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def executorch_lib() -> Path | None:
    """The ``lib/`` of the executorch package Python would import."""
    spec = importlib.util.find_spec("executorch")
    for location in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(location) / "lib"
        if (lib / "libexecutorch.so").is_file():
            return lib
    return None


def libpython() -> Path | None:
    """This interpreter's shared libpython, if it was built with one."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    path = Path(libdir or "", name or "")
    return path if name and path.is_file() else None


def main() -> None:
    package = package_dir()
    runner = package / "bin" / "pte_runner"
    if not runner.is_file():
        sys.exit(
            f"pte_runner: error: no bundled runner at {runner} (this rustconv is not an "
            "installed wheel; in a checkout run target/release/pte_runner)"
        )
    native = _native(package)
    try:
        native.check_executorch(package / native.LIB_NAME)
    except ImportError as e:
        sys.exit(f"pte_runner: error: {e}")
    lib = executorch_lib()
    if lib is not None:
        paths = [str(lib), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
    python = libpython()
    if python is not None:
        os.environ.setdefault("RUSTCONV_LIBPYTHON", str(python))
    os.execv(runner, [str(runner), *sys.argv[1:]])


if __name__ == "__main__":
    main()
