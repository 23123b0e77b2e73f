"""Checks shared by the elementwise ops: operands, broadcasting, dtypes, masks.

Elementwise operands broadcast with NumPy's rules (``schema/rustconv.fbs``):
trailing dimensions aligned, a dimension of static size 1 stretches. With a
dynamic sequence length a size is a sympy expression; a dimension broadcasts
only if it is provably the output's size or statically 1, because the runtime
decides strides once, at load, from the declared shapes.

Comparisons produce bool tensors in torch. The blob has no bool dtype: a
comparison writes 1.0/0.0 in the float dtype of its inputs, and the value (a
"mask") may only be read by ``where`` (as its condition) or by a cast back to
that float dtype, inside the delegate. The partitioner enforces the "inside
the delegate" part (see :mod:`rustconv.export.partition_proposal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.common import (
    MAX_RANK,
    SUPPORTED_DTYPES,
    GraphContext,
    NotSupported,
    aten_op,
    check_rank,
    same_expr,
    shape_exprs,
    tensor_val,
)
from rustconv.export.ops_lowering.registry import lowering_for
from rustconv.export.ops_lowering.scalars import COPY_OPS, is_scalar_like

__all__ = [
    "MASK_READERS",
    "WHERE_OPS",
    "is_where",
    "tensor_operand",
    "elementwise_operand",
    "check_broadcast",
    "check_elementwise_dtypes",
    "check_mask_users",
]

#: Reasons a value may be a mask: where's condition, or a cast to float.
MASK_READERS = "where (as its condition) or a cast to the comparison's float dtype"

_aten = torch.ops.aten
#: ``where``'s overloads: the one op reading a mask as a mask (``check_mask_users``);
#: defined here, below :mod:`.where`, which imports this module.
WHERE_OPS = frozenset(
    {
        _aten.where.self,
        _aten.where.ScalarSelf,
        _aten.where.ScalarOther,
        _aten.where.Scalar,
    }
)


def is_where(node: Node) -> bool:
    return aten_op(node) in WHERE_OPS


def tensor_operand(arg: Any, ctx: GraphContext, role: str, *, mask: bool = False) -> torch.Tensor:
    """Metadata of an operand that must be a tensor the blob can hold.

    ``mask=True`` is for the one role that takes a comparison's bool result.
    Nodes folded away at lowering (scalars, split, pads, SymInts) have no
    tensor of their own and are refused here, naming them.
    """
    val = tensor_val(arg, role)
    if val.dim() == 0:
        # The runtime's values have rank 1..4: a number known at export is
        # folded into an elementwise op instead (is_scalar_like), anything
        # else 0-d (a graph input, a reduction's result) stays outside.
        raise NotSupported(
            f"{role} {arg.name} is a 0-d tensor; RustConv values have rank 1 to {MAX_RANK} "
            "(only a number known at export folds into an elementwise op)"
        )
    if val.dtype == torch.bool:
        if not mask:
            raise NotSupported(
                f"{role} {arg.name} is a bool tensor; RustConv reads a comparison's result "
                f"only in {MASK_READERS}"
            )
        return val
    if mask:
        raise NotSupported(f"{role} {arg.name} is {val.dtype}, not a bool mask")
    if isinstance(arg, Node) and arg.op == "call_function":
        lowering = lowering_for(arg)
        if lowering is not None and lowering.inline_only(arg, ctx):
            raise NotSupported(
                f"{role} {arg.name} is folded into its users at lowering ({lowering.kind}) "
                "and has no tensor of its own here"
            )
    return val


def elementwise_operand(arg: Any, ctx: GraphContext, role: str) -> torch.Tensor | None:
    """``None`` for a scalar operand (folded into the op), else its metadata."""
    if is_scalar_like(arg, ctx):
        return None
    return tensor_operand(arg, ctx, role)


def check_broadcast(out: torch.Tensor, operands: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Every tensor operand broadcasts to ``out`` by NumPy's rules, rank <= 4."""
    check_rank([("output", out), *operands], MAX_RANK)
    out_shape = shape_exprs(out)
    for role, val in operands:
        shape = shape_exprs(val)
        if len(shape) > len(out_shape):
            raise NotSupported(f"{role} has rank {len(shape)} > output rank {len(out_shape)}")
        offset = len(out_shape) - len(shape)
        for axis, size in enumerate(shape):
            target = out_shape[offset + axis]
            if size == 1 or same_expr(size, target):
                continue
            raise NotSupported(
                f"{role} {tuple(shape)} does not broadcast to {tuple(out_shape)} by NumPy's "
                f"rules with static sizes (dimension {axis}: {size} vs {target})"
            )


def check_elementwise_dtypes(named_vals: Sequence[tuple[str, torch.Tensor]]) -> torch.dtype:
    """One supported float dtype across the node's float tensors (masks excluded)."""
    floats = [(name, val) for name, val in named_vals if val.dtype != torch.bool]
    if not floats:
        raise NotSupported("no float tensor operand")
    for name, val in floats:
        if val.dtype not in SUPPORTED_DTYPES:
            raise NotSupported(
                f"{name} dtype {val.dtype} is not supported "
                f"(supported: {', '.join(sorted(str(d) for d in SUPPORTED_DTYPES))})"
            )
    dtypes = {val.dtype for _, val in floats}
    if len(dtypes) > 1:
        raise NotSupported(
            "mixed dtypes " + ", ".join(f"{name}={val.dtype}" for name, val in floats)
        )
    return dtypes.pop()


def check_mask_users(node: Node, dtype: torch.dtype) -> None:
    """A comparison's bool result may only be read as a mask (see module docs)."""
    for user in node.users:
        if is_where(user) and user.args and user.args[0] is node:
            if any(a is node for a in user.args[1:]):
                raise NotSupported(f"{user.name} reads the mask {node.name} as a value")
            continue
        if aten_op(user) in COPY_OPS:
            out = user.meta.get("val")
            if isinstance(out, torch.Tensor) and out.dtype == dtype:
                continue
        raise NotSupported(
            f"its bool result is read by {user.name}; RustConv keeps a comparison's result "
            f"inside the delegate, read only by {MASK_READERS}"
        )
