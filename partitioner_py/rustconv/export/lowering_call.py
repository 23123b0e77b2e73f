"""Which partitioners share the ``to_edge_transform_and_lower`` call asking us.

ExecuTorch 1.5.1 (``exir/program/_program.py``, ``_gen_edge_manager_for_partitioners``)
runs one decomposition pass per partitioner of the list, in order, on the same
program. A partitioner whose ``ops_to_not_decompose`` returns a filter goes
down the ``EDGE_DO_NOT_DECOMP`` path: ``run_decompositions`` with the default
table minus *its* ops, then the full table on everything its filter did not
protect. One that returns no filter gets the default table minus its ops,
whenever any op of that table is in the graph. Either way a pass decomposes the
ops every other partitioner wanted kept (XNNPACK's ``aten.linear``, its
dynamically quantized linear pattern), whichever place it has in the list. So
:class:`rustconv.RustConvPartitioner` must know whether it is alone: alone, its
pass is the only one and decomposes what it does not take; with others, its
pass must change nothing and leave every decision to theirs.

ExecuTorch passes ``ops_to_not_decompose`` only the program. The list is a
local of the caller's frame: ``partitioners_for_program`` in
``_gen_edge_manager_for_partitioners`` (the decomposition passes, also through
``_can_skip_using_EDGE_DO_NOT_DECOMP``), ``partitioners`` in
``to_edge_transform_and_lower`` (its check after lowering that nothing kept
whole was left behind). :func:`current_call` reads it there and nowhere else;
``tests`` pin this to executorch 1.5.1. Called from anywhere else, or if a
later ExecuTorch moves those locals, it raises :class:`UnknownCaller` rather
than guess: guessing "alone" is exactly the wrong-results bug of issue 16.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["EXECUTORCH_VERSION", "LoweringCall", "UnknownCaller", "current_call"]

#: The ExecuTorch release whose frames :func:`current_call` reads.
EXECUTORCH_VERSION = "1.5.1"

# function name in exir/program/_program.py -> (its local holding the list, phase)
_SITES = {
    "_gen_edge_manager_for_partitioners": ("partitioners_for_program", "decomposition"),
    "to_edge_transform_and_lower": ("partitioners", "check"),
}
_MAX_DEPTH = 8


def installed_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class UnknownCaller(RuntimeError):
    """``ops_to_not_decompose`` was called from outside ``to_edge_transform_and_lower``."""


@dataclass(frozen=True)
class LoweringCall:
    """The partitioner list of the current call, and which of its steps asks."""

    partitioners: list
    #: "decomposition" (before lowering) or "check" (after lowering).
    phase: str


def current_call(partitioner: object) -> LoweringCall:
    """The ``to_edge_transform_and_lower`` call ``partitioner`` is part of.

    Walks up at most a few frames from the caller to the first frame of
    ``executorch.exir.program._program`` named in ``_SITES`` whose list holds
    ``partitioner`` itself.
    """
    from executorch.exir.program import _program

    module_globals = vars(_program)
    frame = sys._getframe(1)
    try:
        for _ in range(_MAX_DEPTH):
            if frame is None:
                break
            site = _SITES.get(frame.f_code.co_name)
            if site is not None and frame.f_globals is module_globals:
                local, phase = site
                found = frame.f_locals.get(local)
                if isinstance(found, (list, tuple)) and any(p is partitioner for p in found):
                    return LoweringCall(list(found), phase)
            frame = frame.f_back
    finally:
        del frame
    raise UnknownCaller(
        f"{type(partitioner).__name__}.ops_to_not_decompose was called outside "
        "executorch.exir.to_edge_transform_and_lower (or by an ExecuTorch whose "
        f"to_edge_transform_and_lower it does not know: this is {installed_version()}, it reads "
        f"{EXECUTORCH_VERSION}'s). It needs the partitioner list to decide what to keep "
        "whole without changing what the other partitioners see; see "
        "rustconv.export.lowering_call. "
        "Lower through to_edge_transform_and_lower, or through to_edge(...).to_backend(...)."
    )
