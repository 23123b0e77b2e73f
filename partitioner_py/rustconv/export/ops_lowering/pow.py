"""``pow(x, exponent)`` with a constant exponent -> ``Binary Mul`` or ``Unary``.

RMSNorm's decomposition squares with ``pow(x, 2)`` (``aten.pow.Tensor_Scalar``):
that is ``x * x``. The exponents with an elementwise op of their own are
taken too: 0.5 (``sqrt``), -0.5 (``rsqrt``) and -1 (``reciprocal``); any other
is left to other backends, with a reason.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import GraphContext, NotSupported, bound_args, tensor_val
from rustconv.export.ops_lowering.operands import (
    check_broadcast,
    check_elementwise_dtypes,
    tensor_operand,
)
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.scalars import is_number
from rustconv.fb.Binary import BinaryT
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.Op import Op
from rustconv.fb.Unary import UnaryT
from rustconv.fb.UnaryOp import UnaryOp

__all__ = ["PowLowering"]

_aten = torch.ops.aten

#: Exponent -> the unary op computing it (2 is ``x * x``).
_UNARY_POWERS = {0.5: UnaryOp.Sqrt, -0.5: UnaryOp.Rsqrt, -1.0: UnaryOp.Reciprocal}


def _exponent(node: Node) -> float:
    exponent = bound_args(node)["exponent"]
    if not is_number(exponent) or float(exponent) not in (2.0, *_UNARY_POWERS):
        raise NotSupported(
            f"pow with exponent {exponent!r}; RustConv computes exponents 2, 0.5, -0.5 and -1"
        )
    return float(exponent)


@register
class PowLowering(OpLowering):
    kind = "pow"
    targets = (_aten.pow.Tensor_Scalar,)

    def check(self, node: Node, ctx: GraphContext) -> None:
        _exponent(node)
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_broadcast(out, [("input", x)])

    def emit(self, node: Node, builder: Builder) -> None:
        exponent = _exponent(node)
        x = builder.value(bound_args(node)["self"], node, "input")
        if exponent == 2.0:
            op = BinaryT()
            op.op, op.a, op.b = BinaryOp.Mul, x, x
            op.output = builder.new_output(node)
            builder.add(node, Op.Binary, op)
            return
        op = UnaryT()
        op.op, op.input = _UNARY_POWERS[exponent], x
        op.output = builder.new_output(node)
        builder.add(node, Op.Unary, op)
