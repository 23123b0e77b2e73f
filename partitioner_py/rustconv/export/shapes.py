"""Static sizes and upper bounds of dynamic sizes, for ``Value.dims``.

The runtime plans memory once, for the largest shape, so every dimension is
recorded as a concrete number: a static size as itself, a dynamic size (a
``SymInt`` in ``node.meta["val"]``) as its upper bound with ``dynamic = true``.

A dynamic size is a sympy expression over the program's shape symbols: ``s0``
for an input exported with ``Dim("seq", max=...)``, or e.g.
``(s0 + 2*p - d*(k - 1) - 1)//stride + 1`` for a strided convolution's output.
Its upper bound is found by interval arithmetic (``bound_sympy``) over the
symbols' ranges, taken from ``ExportedProgram.range_constraints`` and, for a
symbol not listed there, from the tensor's ``ShapeEnv``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy
import torch
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from rustconv.errors import DynamicShapeError
from rustconv.fb.Dim import DimT

__all__ = ["upper_bound", "make_dims", "finite_int"]

_INFINITIES = (int_oo, -int_oo, sympy.oo, -sympy.oo, sympy.zoo)


def finite_int(bound: sympy.Expr) -> int | None:
    """A bound from ``bound_sympy`` as an int; ``None`` if infinite or symbolic.

    torch's ``int_oo`` claims to be a finite integer to sympy (and ``int()``
    of it raises deep in sympy), so infinities are tested explicitly.
    """
    if bound in _INFINITIES or not bound.is_number or bound.free_symbols:
        return None
    try:
        return int(bound)
    except (TypeError, ValueError, AttributeError):
        return None


def upper_bound(
    size: torch.SymInt,
    ranges: Mapping[sympy.Symbol, ValueRanges],
    what: str = "a dimension",
) -> int:
    """The largest value ``size`` can take; raises ``DynamicShapeError`` if unbounded."""
    expr = sympy.sympify(size.node.expr)
    symbols = expr.free_symbols
    if symbols <= set(ranges):
        upper = bound_sympy(expr, {s: ranges[s] for s in symbols}).upper
    else:
        shape_env = getattr(size.node, "shape_env", None)
        if shape_env is None:
            missing = ", ".join(sorted(str(s) for s in symbols - set(ranges)))
            raise DynamicShapeError(
                f"{what} has size {expr}, but the range of {missing} is unknown "
                "(not in the program's range constraints and no shape environment)"
            )
        upper = shape_env.bound_sympy(expr).upper

    bound = finite_int(upper)
    if bound is None:
        raise DynamicShapeError(
            f"{what} has dynamic size {expr} with no finite upper bound. RustConv "
            "plans memory for the largest shape, so every dynamic dimension needs "
            'a maximum: export with e.g. torch.export.Dim("seq", max=4096).'
        )
    if bound < 0:
        raise DynamicShapeError(f"{what} has size {expr} with upper bound {bound} < 0")
    return bound


def _as_static(size: int | torch.SymInt) -> int | None:
    if isinstance(size, int):
        return size
    return size.node.maybe_as_int()


def make_dims(
    shape: Sequence[int | torch.SymInt],
    ranges: Mapping[sympy.Symbol, ValueRanges],
    what: str = "a tensor",
) -> list[DimT]:
    """``Dim`` structs for ``shape``: static sizes as-is, dynamic ones as bounds."""
    dims = []
    for i, size in enumerate(shape):
        dim = DimT()
        static = _as_static(size)
        if static is not None:
            dim.size, dim.dynamic = static, False
        else:
            dim.size = upper_bound(size, ranges, f"dimension {i} of {what}")
            dim.dynamic = True
        dims.append(dim)
    return dims
