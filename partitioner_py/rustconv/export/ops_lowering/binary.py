"""Two-operand elementwise ops and comparisons -> ``Binary``.

Either operand may be a scalar (a number or a 0-d constant, folded into
``a_scalar``/``b_scalar`` with index -1), but not both. ``alpha`` of
``add``/``sub``/``rsub`` is folded: into the scalar when the scaled operand is
one, else as a ``Mul`` node before the ``Add``/``Sub``. ``rsub`` swaps its
operands. Comparisons write 1.0/0.0 in the dtype of their inputs (see
:mod:`.operands` for where such a mask may go).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import (
    check_broadcast,
    check_elementwise_dtypes,
    check_mask_users,
    elementwise_operand,
)
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.scalars import is_number
from rustconv.fb.Binary import BinaryT
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.Op import Op

__all__ = [
    "ARITHMETIC_OPS",
    "BINARY_REFERENCE",
    "COMPARISON_OPS",
    "BinaryLowering",
    "comparison_dtype",
]

_aten = torch.ops.aten


@dataclass(frozen=True)
class _Binary:
    """One ``BinaryOp``: what it computes and the ATen overloads lowered to it."""

    code: int
    #: Its meaning, in torch: the blob interpreter's evaluation of it.
    reference: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    aten: tuple[torch._ops.OpOverload, ...]


def _comparison(name: str, code: int) -> _Binary:
    ops = getattr(_aten, name)
    return _Binary(code, getattr(torch, name), (ops.Tensor, ops.Scalar))


#: Every ``BinaryOp``, one row each (arithmetic, then comparisons): adding one
#: to the schema is one row here (and one in the runtime's ``elementwise_ops!``).
_ARITHMETIC = (
    _Binary(BinaryOp.Add, torch.add, (_aten.add.Tensor, _aten.add.Scalar)),
    _Binary(
        BinaryOp.Sub,
        torch.sub,
        (_aten.sub.Tensor, _aten.sub.Scalar, _aten.rsub.Tensor, _aten.rsub.Scalar),
    ),
    _Binary(BinaryOp.Mul, torch.mul, (_aten.mul.Tensor, _aten.mul.Scalar)),
    _Binary(
        BinaryOp.Div,
        torch.div,
        (_aten.div.Tensor, _aten.div.Scalar, _aten.div.Tensor_mode, _aten.div.Scalar_mode),
    ),
    _Binary(BinaryOp.Maximum, torch.maximum, (_aten.maximum.default,)),
    _Binary(BinaryOp.Minimum, torch.minimum, (_aten.minimum.default,)),
)
_COMPARISONS = (
    _comparison("gt", BinaryOp.Gt),
    _comparison("ge", BinaryOp.Ge),
    _comparison("lt", BinaryOp.Lt),
    _comparison("le", BinaryOp.Le),
    _comparison("eq", BinaryOp.Eq),
    _comparison("ne", BinaryOp.Ne),
)

ARITHMETIC_OPS: dict[torch._ops.OpOverload, int] = {
    overload: row.code for row in _ARITHMETIC for overload in row.aten
}
COMPARISON_OPS: dict[torch._ops.OpOverload, int] = {
    overload: row.code for row in _COMPARISONS for overload in row.aten
}
#: BinaryOp -> what it computes (:data:`_Binary.reference`).
BINARY_REFERENCE: dict[int, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    row.code: row.reference for row in (*_ARITHMETIC, *_COMPARISONS)
}

_SWAPPED = frozenset({_aten.rsub.Tensor, _aten.rsub.Scalar})


def _operands(node: Node) -> tuple[Any, Any, float]:
    """(a, b, alpha) with ``output = a op (alpha * b)`` (rsub already swapped)."""
    op = aten_op(node)
    args = bound_args(node)
    alpha = args.get("alpha", 1)
    if not is_number(alpha):
        raise NotSupported(f"alpha is {alpha!r}, not a number")
    if args.get("rounding_mode") is not None:
        raise NotSupported(f"div with rounding_mode={args['rounding_mode']!r}")
    a, b = args["self"], args["other"]
    if op in _SWAPPED:
        a, b = b, a
    return a, b, float(alpha)


def _check(node: Node, ctx: GraphContext) -> torch.dtype:
    a, b, _ = _operands(node)
    vals = [
        (role, val)
        for role, val in (("self", elementwise_operand(a, ctx, "self")),
                          ("other", elementwise_operand(b, ctx, "other")))
        if val is not None
    ]  # fmt: skip
    if not vals:
        raise NotSupported("both operands are scalars")
    out = tensor_val(node, "output")
    dtype = check_elementwise_dtypes([*vals, ("output", out)])
    check_broadcast(out, vals)
    return dtype


def comparison_dtype(node: Node, ctx: GraphContext) -> torch.dtype | None:
    """The float dtype a supported comparison compares (its mask's blob dtype)."""
    if aten_op(node) not in COMPARISON_OPS:
        return None
    try:
        return _check(node, ctx)
    except NotSupported:
        return None


@register
class BinaryLowering(OpLowering):
    kind = "binary"
    targets = (*ARITHMETIC_OPS, *COMPARISON_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        dtype = _check(node, ctx)
        if aten_op(node) in COMPARISON_OPS:
            check_mask_users(node, dtype)

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        # A mask exists only inside the delegate, next to its readers.
        return aten_op(node) in COMPARISON_OPS

    def emit(self, node: Node, builder: Builder) -> None:
        op_overload = aten_op(node)
        a, b, alpha = _operands(node)
        binary = BinaryT()
        binary.a, binary.aScalar = builder.operand(a, node, "self")
        binary.b, binary.bScalar = builder.operand(b, node, "other")
        if alpha != 1.0:
            if binary.b < 0:
                binary.bScalar *= alpha
            else:
                binary.b = self._scaled(node, builder, binary.b, alpha)
        if op_overload in COMPARISON_OPS:
            binary.op = COMPARISON_OPS[op_overload]
            dtype = comparison_dtype(node, builder.ctx)
            binary.output = builder.new_output(node, dtype=dtype, is_mask=True)
        else:
            binary.op = ARITHMETIC_OPS[op_overload]
            binary.output = builder.new_output(node)
        builder.add(node, Op.Binary, binary)

    @staticmethod
    def _scaled(node: Node, builder: Builder, source: int, alpha: float) -> int:
        """Emits ``alpha * source`` (add/sub's alpha on a tensor operand)."""
        mul = BinaryT()
        mul.op = BinaryOp.Mul
        mul.a = source
        mul.b, mul.bScalar = -1, alpha
        mul.output = builder.derived_value(source, f"{node.name}_alpha")
        builder.add(node, Op.Binary, mul)
        return mul.output


@evaluates(Op.Binary)
def _evaluate(op: BinaryT, env: BlobEnv) -> torch.Tensor:
    result = BINARY_REFERENCE[op.op](env.operand(op.a, op.aScalar), env.operand(op.b, op.bScalar))
    return result.float()  # comparisons: 1.0 / 0.0
