"""Loads the RustConv runtime into ExecuTorch's Python runtime.

``import rustconv.runtime`` makes ``executorch.runtime`` able to run programs
containing ``RustConvBackend`` delegates, and programs that call the
``rustconv::linear_scan.out`` operator: the out variant (see ``rustconv.ops``)
that ``to_executorch()`` emits for a linear scan no delegate took, e.g. one
lowered with XNNPACK alone or an fp64 scan. The Rust backend is a shared
library whose static initialiser registers both, the backend and that
operator's kernel (``delegate/cpp/scan_kernel.cpp``), with the ExecuTorch
runtime that is already in the process, so the order matters:

1. ``import executorch.runtime`` first, so ExecuTorch's shared library (and its
   backend and operator registries) is loaded;
2. ``ctypes.CDLL(path, RTLD_GLOBAL)`` the backend library, which resolves its
   ExecuTorch symbols against that library and registers itself;
3. check that ``"RustConvBackend"`` is now a registered backend and
   ``"rustconv::linear_scan.out"`` a registered operator.

``pte_runner`` links the same code and registers the same two. Registering the
kernel is idempotent, and a kernel already registered under that name (say by
a second copy of the library) is kept rather than registered again, which
ExecuTorch would treat as a fatal error.

The library is looked up, in order, at:

* ``$RUSTCONV_BACKEND_LIB``, if set (then it must exist);
* ``<repo>/target/release/librustconv_backend.so`` when this package is a
  source checkout's ``partitioner_py/rustconv`` (built with
  ``cargo build --release``);
* ``librustconv_backend.so`` inside this package (an installed wheel).

Before loading it, the executorch version the library was built for is
compared with the installed one (``rustconv.native``); a mismatch is an
``ImportError`` naming both.

Importing it also makes every ``executorch.runtime`` ``Method`` keep its
``Program`` alive (:func:`keep_programs_alive`): in ExecuTorch 1.5.1 a method
is freed with its program, so ``Runtime.get().load_program(path)
.load_method("forward")``, as written in one expression, returns a method whose
``execute`` reads freed memory (a segfault in ``Method::inputs_size``, or
garbage), whatever backends the program uses.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import executorch.runtime  # noqa: F401  (must precede loading the backend)

from rustconv import native
from rustconv.backend_id import BACKEND_ID

__all__ = [
    "BACKEND_NAME",
    "SCAN_KERNEL_NAME",
    "ENV_VAR",
    "library_path",
    "is_loaded",
    "has_scan_kernel",
    "candidate_paths",
    "reset_state",
    "keep_programs_alive",
]

#: The backend id (one definition: :mod:`rustconv.backend_id`).
BACKEND_NAME = BACKEND_ID
#: The operator kernel for scans outside any delegate (``rustconv.ops``).
SCAN_KERNEL_NAME = "rustconv::linear_scan.out"
ENV_VAR = "RUSTCONV_BACKEND_LIB"
_BUILD_COMMAND = "cargo build --release  (in the repository root), or pip install ."
_library: ctypes.CDLL | None = None
_library_path: Path | None = None


def candidate_paths() -> list[Path]:
    """Where the backend library is looked for, in order."""
    env = os.environ.get(ENV_VAR)
    if env:
        # An explicit choice is not silently replaced by another build.
        return [Path(env)]
    paths = []
    if native.PACKAGE_DIR.parent.name == "partitioner_py":
        paths.append(native.PACKAGE_DIR.parent.parent / "target" / "release" / native.LIB_NAME)
    return [*paths, native.PACKAGE_DIR / native.LIB_NAME]


def _registered_backends() -> list[str]:
    from executorch.runtime import Runtime

    return list(Runtime.get().backend_registry.registered_backend_names)


def _registered_operators() -> set[str]:
    from executorch.runtime import Runtime

    return set(Runtime.get().operator_registry.operator_names)


def _load() -> None:
    global _library, _library_path
    if BACKEND_NAME in _registered_backends():
        # Linked in some other way (e.g. a custom ExecuTorch build); nothing to do.
        return
    tried = candidate_paths()
    path = next((p for p in tried if p.is_file()), None)
    if path is None:
        source = f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "the default locations"
        raise ImportError(
            f"RustConv backend library not found ({source}); tried:\n"
            + "".join(f"  {p}\n" for p in tried)
            + f"Build it with: {_BUILD_COMMAND}, or set {ENV_VAR} to its path."
        )
    native.check_executorch(path)
    try:
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise ImportError(f"could not load the RustConv backend from {path}: {e}") from e
    registered = _registered_backends()
    if BACKEND_NAME not in registered:
        raise ImportError(
            f"loaded {path}, but {BACKEND_NAME!r} is not registered with the "
            f"ExecuTorch runtime (registered: {registered}). The library may have "
            "been built against a different ExecuTorch than the one installed; "
            f"rebuild it with: {_BUILD_COMMAND}"
        )
    if SCAN_KERNEL_NAME not in _registered_operators():
        raise ImportError(
            f"loaded {path}, which registered {BACKEND_NAME!r} but not the "
            f"{SCAN_KERNEL_NAME!r} kernel; it was built from older sources, so "
            f"rebuild it with: {_BUILD_COMMAND}"
        )
    _library, _library_path = library, path


def library_path() -> Path | None:
    """The backend library this module loaded, or None if it was already registered."""
    return _library_path


def is_loaded() -> bool:
    """Whether ``RustConvBackend`` is registered with the ExecuTorch runtime."""
    return BACKEND_NAME in _registered_backends()


def has_scan_kernel() -> bool:
    """Whether ``rustconv::linear_scan.out`` is a registered ExecuTorch operator."""
    return SCAN_KERNEL_NAME in _registered_operators()


def reset_state() -> None:
    """Puts every RustConv delegate's state back to its initial value (zero).

    Delegates own the mutable buffers the partitioner tagged (convolution and
    scan states, see :class:`rustconv.RustConvPartitioner`); each restores
    its initial state at the start of its next call. This is the backend
    option ``reset_state`` (C++: ``executorch::runtime::set_option(
    "RustConvBackend", ...)`` with ``reset_state = true``), reached through
    the library's C entry point because ExecuTorch's Python runtime has no
    backend options. It applies to every loaded program; loading a method
    again also starts it from zero.
    """
    library = _library if _library is not None else ctypes.CDLL(None)
    library.rustconv_reset_state.restype = None
    library.rustconv_reset_state()


def keep_programs_alive() -> None:
    """Makes ``executorch.runtime.Program.load_method`` return methods that
    hold a reference to their program (idempotent; done on import).

    ExecuTorch 1.5.1's ``Method`` holds only the native method, which its
    native program owns; once the Python ``Program`` is collected (at once, in
    ``Runtime.get().load_program(...).load_method(...)``), the method points
    into freed memory and ``execute`` crashes or computes garbage, for any
    program, delegated or not. Holding the program for as long as the method
    lives is what a caller keeping both would do.
    """
    from executorch.runtime import Program

    load_method = Program.load_method
    if getattr(load_method, "_rustconv_keeps_program", False):
        return

    @functools.wraps(load_method)
    def load_method_keeping_program(self, name):  # type: ignore[no-untyped-def]
        method = load_method(self, name)
        if method is not None:
            method._rustconv_program = self
        return method

    load_method_keeping_program._rustconv_keeps_program = True  # type: ignore[attr-defined]
    Program.load_method = load_method_keeping_program  # type: ignore[method-assign]


_load()
keep_programs_alive()
