"""torch's materialization of composite (CIA) ops done once per registry state,
for the test run.

Every ``run_decompositions`` (``to_edge`` and each partitioner's pass of
``to_edge_transform_and_lower``) asks ``torch._export.utils`` for the
preservable composite ops, and that walks the C++ dispatcher's
CompositeImplicitAutograd registrations and looks each up in ``torch.ops``,
once per op namespace: a fifth of an export's time in a profile of the random
chains and norm tests, 12% off the random chains' time without the profiler.
The lookups only create the ``torch.ops`` entries; repeating them changes
nothing until the dispatcher's registrations change (a library defines or
drops an op), which is what the memo compares. torch leaves it uncached
because Python can add registrations at any time: the comparison catches
those.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch._export.utils as export_utils

_KEY = "CompositeImplicitAutograd"


def install() -> Callable[[], None]:
    """Wraps ``_materialize_cpp_cia_ops``; returns the function that unwraps it."""
    original = export_utils._materialize_cpp_cia_ops
    done: list[list[str]] = []

    def materialize_when_registrations_change() -> None:
        now = torch._C._dispatch_get_registrations_for_dispatch_key(_KEY)
        if done and done[0] == now:
            return
        original()
        done[:] = [now]

    export_utils._materialize_cpp_cia_ops = materialize_when_registrations_change

    def uninstall() -> None:
        export_utils._materialize_cpp_cia_ops = original

    return uninstall
