"""``elu`` -> ``where(x > 0, scale * x, scale * alpha * (exp(input_scale * x) - 1))``.

``nn.ELU`` is the activation of every SEANet conv (transformers' Mimi
encoder and decoder, EnCodec): left to the portable kernel it split each
conv into its own call. It is written with ops the fused kernels already
run (a comparison, ``exp``, two multiply-adds by constants and a select),
so it fuses into the prologue or epilogue of the conv next to it like any
elementwise chain, and needs no op kind of its own in the blob. ``where``
selects, so ``exp`` overflowing to infinity for a large positive input is
never read. ``alpha``, ``scale`` and ``input_scale`` (``aten.elu``'s three
numbers; ``nn.ELU`` sets only alpha, ``selu`` all three) must be known at
export.
"""

from __future__ import annotations

from typing import Any

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
from rustconv.fb.Where import WhereT

__all__ = ["ELU_OPS", "EluLowering", "elu_params"]

_aten = torch.ops.aten
ELU_OPS = frozenset({_aten.elu.default})


def elu_params(node: Node) -> tuple[Node, float, float, float]:
    """(input, alpha, scale, input_scale) as numbers."""
    args = bound_args(node)
    numbers = []
    for name in ("alpha", "scale", "input_scale"):
        value: Any = args[name]
        if not is_number(value):
            raise NotSupported(f"elu's {name} is {value!r}, not a number known at export")
        numbers.append(float(value))
    return args["self"], *numbers


@register
class EluLowering(OpLowering):
    kind = "elu"
    targets = tuple(ELU_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        elu_params(node)
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_broadcast(out, [("input", x)])

    def emit(self, node: Node, builder: Builder) -> None:
        source, alpha, scale, input_scale = elu_params(node)
        x = builder.value(source, node, "input")

        def binary(op: int, a: int, b: float, suffix: str, *, is_mask: bool = False) -> int:
            b_op = BinaryT()
            b_op.op, b_op.a, b_op.aScalar, b_op.b, b_op.bScalar = op, a, 0.0, -1, b
            b_op.output = builder.value_like(node, f"{node.name}_{suffix}", is_mask=is_mask)
            builder.add(node, Op.Binary, b_op)
            return b_op.output

        scaled = binary(BinaryOp.Mul, x, input_scale, "in") if input_scale != 1.0 else x
        exp = UnaryT()
        exp.op, exp.input = UnaryOp.Exp, scaled
        exp.output = builder.value_like(node, f"{node.name}_exp")
        builder.add(node, Op.Unary, exp)
        negative = binary(BinaryOp.Sub, exp.output, 1.0, "expm1")
        negative = binary(BinaryOp.Mul, negative, alpha * scale, "neg")
        positive = binary(BinaryOp.Mul, x, scale, "pos") if scale != 1.0 else x
        where = WhereT()
        where.cond = binary(BinaryOp.Gt, x, 0.0, "mask", is_mask=True)
        where.a, where.aScalar = positive, 0.0
        where.b, where.bScalar = negative, 0.0
        where.output = builder.new_output(node)
        builder.add(node, Op.Where, where)
