"""Scalar operands: Python numbers and 0-d constants, folded into the op.

An elementwise operand that is a number in torch's call (``x * 2``) reaches
the graph in several shapes depending on the flow: a literal in the node's
arguments (``aten.mul.Scalar`` or ``aten.gt.Scalar``), a lifted 0-d constant
(``to_edge`` turns ``x / 2.0`` into ``div.Tensor(x, _lifted_tensor_constant)``),
that constant behind a dtype conversion (``_to_dim_order_copy``), or an
``aten.scalar_tensor`` node (``torch.where(c, x, 0.0)``). All of them become
the ``*_scalar`` field of a ``Binary``/``Where`` with the operand index -1,
so the runtime never sees a 0-d tensor for them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.common import GraphContext, NotSupported, aten_op, bound_args

__all__ = ["COPY_OPS", "SCALAR_TENSOR_OPS", "is_number", "is_scalar_like", "scalar_value"]

_aten = torch.ops.aten

#: Ops that copy their input unchanged apart from dtype or memory format;
#: as a value they are ``Unary Identity`` (see :mod:`.unary`).
COPY_OPS = frozenset(
    {
        _aten.clone.default,
        _aten.alias.default,
        _aten.alias_copy.default,
        _aten._to_copy.default,
        _aten.lift_fresh_copy.default,
        _aten.detach.default,
        _aten.detach_copy.default,
        torch.ops.dim_order_ops._to_dim_order_copy.default,
        torch.ops.dim_order_ops._clone_dim_order.default,
    }
)

SCALAR_TENSOR_OPS = frozenset({_aten.scalar_tensor.default})


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, torch.SymInt)


def _is_0d(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 0


def is_scalar_like(arg: Any, ctx: GraphContext) -> bool:
    """Whether ``arg`` is a number known at export (literal or 0-d constant)."""
    if isinstance(arg, bool) or is_number(arg):
        return True
    if not isinstance(arg, Node) or not _is_0d(arg):
        return False
    if arg.op == "placeholder":
        return ctx.is_constant(arg)
    op = aten_op(arg)
    if op in SCALAR_TENSOR_OPS:
        return is_number(arg.args[0])
    if op in COPY_OPS and arg.args:
        return is_scalar_like(arg.args[0], ctx)
    return False


def scalar_value(arg: Any, ctx: GraphContext) -> float:
    """The number behind a scalar-like operand, as torch would compute it."""
    if isinstance(arg, bool) or is_number(arg):
        return float(arg)
    if not isinstance(arg, Node) or not is_scalar_like(arg, ctx):
        raise NotSupported(f"{arg!r} is not a constant scalar")
    val: torch.Tensor = arg.meta["val"]
    if arg.op == "placeholder":
        tensor = ctx.constant_tensor(arg)
        if tensor is None or tensor.is_meta:
            raise NotSupported(f"the constant {arg.name} has no data")
        return float(tensor.detach().to(val.dtype).item())
    op = aten_op(arg)
    if op in SCALAR_TENSOR_OPS:
        return float(torch.scalar_tensor(arg.args[0], dtype=val.dtype).item())
    inner = scalar_value(bound_args(arg)["self"], ctx)
    return float(torch.tensor(inner, dtype=torch.float64).to(val.dtype).item())
