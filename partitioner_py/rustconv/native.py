"""Where the native runtime lives and whether it fits the installed ExecuTorch.

The Rust library records the executorch version it was compiled and linked
against (``RUSTCONV_BUILT_FOR_EXECUTORCH=<version>`` in ``delegate/src/lib.rs``,
from delegate/build.rs). It is read from the file, without loading it: a library
loaded into another ExecuTorch could fail in the dynamic loader with an
undefined symbol, or worse register itself against a runtime whose classes
have another layout. :func:`check_executorch` turns a mismatch into an
``ImportError`` naming both versions.

Standard library only: the ``pte_runner`` launcher (rustconv_pte_runner)
loads this file without importing the package, which imports torch.
"""

from __future__ import annotations

import importlib.metadata
import mmap
from pathlib import Path

__all__ = [
    "LIB_NAME",
    "PACKAGE_DIR",
    "built_for",
    "installed_executorch",
    "check_executorch",
    "pte_runner_command",
]

LIB_NAME = "librustconv_backend.so"
#: An installed wheel keeps the library here and pte_runner in ``bin/``.
PACKAGE_DIR = Path(__file__).resolve().parent
_MARKER = b"RUSTCONV_BUILT_FOR_EXECUTORCH="


def pte_runner_command() -> list[str]:
    """How to start pte_runner: ``$PTE_RUNNER``; else the one beside
    ``$RUSTCONV_BACKEND_LIB``; else a source checkout's release build; else the
    installed wheel's ``pte_runner`` command (its launcher finds the installed
    executorch's libraries wherever they are)."""
    import os
    import sys

    if path := os.environ.get("PTE_RUNNER"):
        return [path]
    if lib := os.environ.get("RUSTCONV_BACKEND_LIB"):
        return [str(Path(lib).parent / "pte_runner")]
    if PACKAGE_DIR.parent.name == "partitioner_py":
        built = PACKAGE_DIR.parent.parent / "target" / "release" / "pte_runner"
        if built.is_file():
            return [str(built)]
    return [sys.executable, "-m", "rustconv_pte_runner"]


def built_for(library: Path) -> str | None:
    """The executorch version ``library`` was built against (None if it does
    not say: a build older than the record)."""
    with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        start = m.find(_MARKER)
        if start < 0:
            return None
        start += len(_MARKER)
        end = m.find(b"\0", start, start + 64)
        return m[start:end].decode() if end > start else None


def installed_executorch() -> str | None:
    """The installed executorch distribution's version, if any."""
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> str:
    # A local build ("1.5.1+cpu") is the same release.
    return version.split("+", 1)[0]


def check_executorch(library: Path) -> None:
    """Raises ImportError if ``library`` was built for another executorch
    than the installed one."""
    wanted = built_for(library)
    have = installed_executorch()
    if wanted is None or have is None or _release(wanted) == _release(have):
        return
    raise ImportError(
        f"the RustConv runtime {library} was built for executorch {wanted}, but "
        f"executorch {have} is installed. Install executorch=={wanted}, or rebuild "
        f"RustConv against {have} (pip install --no-build-isolation . in its source, "
        "or cargo build --release in a checkout)."
    )
