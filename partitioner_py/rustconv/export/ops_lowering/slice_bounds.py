"""Encoding slice bounds in the schema's Python-style convention.

``Slice.start``/``end`` follow Python: a negative bound counts from the end of
the dimension *as it is at run time*, both are clamped to it, and
``end = INT64_MAX`` reads to the end. That is what keeps a slice of a dynamic
length exact: ``x[..., :-2]`` of a length ``s0 + 2`` is ``end = -2`` for every
``s0``, where the exported graph says ``end = s0``.

So a bound is expressible when it is a constant, or the dimension's length
minus a constant ``c`` (encoded ``-c``), or at least the length (encoded
``INT64_MAX``). Anything else (``s0 // 2``) depends on the run-time length in
a way the blob cannot state, and the slice is refused.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch.fx import Node

from rustconv.export.ops_lowering.common import NotSupported, dim_expr

__all__ = ["INT64_MAX", "bound_expr", "encode_bound"]

INT64_MAX = 2**63 - 1
# torch writes "to the end" as INT64_MAX (sometimes INT64_MAX - 1 or
# sys.maxsize after arithmetic); anything this large is "to the end".
_TO_THE_END = 2**62


def bound_expr(value: Any, what: str) -> sympy.Expr | None:
    """A slice bound (int, SymInt, a node computing one, or already an expression)
    as sympy; None if absent."""
    if value is None:
        return None
    if isinstance(value, sympy.Basic):
        return sympy.sympify(value)
    if isinstance(value, Node):
        value = value.meta.get("val")
        if value is None:
            raise NotSupported(f"{what} has no value recorded at export")
    if isinstance(value, torch.SymInt):
        return sympy.sympify(value.node.expr)
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotSupported(f"{what} is {value!r}, not an int")
    return sympy.Integer(value)


def _min_size(size: int | torch.SymInt) -> int | None:
    """The smallest value a dimension can take, if known."""
    if isinstance(size, int):
        return size
    shape_env = getattr(size.node, "shape_env", None)
    if shape_env is None:
        return None
    from rustconv.export.shapes import finite_int

    # An unbacked size (one export learns only at run time, e.g. from a
    # tensor's value) has the lower bound -int_oo, or none known.
    return finite_int(shape_env.bound_sympy(sympy.sympify(size.node.expr)).lower)


def encode_bound(value: Any, size: int | torch.SymInt, what: str, *, is_end: bool) -> int:
    """The schema's encoding of a slice ``start`` (``is_end=False``) or ``end``.

    ``size`` is the sliced dimension's length (a SymInt when dynamic).
    """
    expr = bound_expr(value, what)
    if expr is None:
        return INT64_MAX if is_end else 0
    if expr.is_number:
        bound = int(expr)
        return INT64_MAX if bound >= _TO_THE_END else bound
    length = dim_expr(size)
    offset = sympy.simplify(expr - length)
    if not offset.is_Integer:
        raise NotSupported(
            f"{what} {expr} is neither a constant nor the dimension's length {length} "
            "minus a constant; the blob's Python-style bounds cannot express it"
        )
    c = int(offset)
    if c >= 0:
        return INT64_MAX
    smallest = _min_size(size)
    if smallest is None or smallest + c < 0:
        raise NotSupported(
            f"{what} {expr} = {length} - {-c} could be negative at run time, where "
            "torch and a Python-style bound disagree"
        )
    return c
