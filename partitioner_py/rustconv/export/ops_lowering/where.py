"""``torch.where(cond, a, b)`` -> ``Where``.

The condition must be a mask computed by a comparison inside the delegate
(the blob has no bool tensors); ``a`` and ``b`` may be scalars, each folded
into its ``*_scalar`` field. The mask's blob dtype is its comparison's input
dtype, so it must be the dtype of the ``where`` itself.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    bound_args,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import (
    WHERE_OPS,
    check_broadcast,
    check_elementwise_dtypes,
    elementwise_operand,
    is_where,
    tensor_operand,
)
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.fb.Op import Op
from rustconv.fb.Where import WhereT

__all__ = ["WHERE_OPS", "WhereLowering", "is_where"]


def _operands(node: Node) -> tuple[Any, Any, Any]:
    args = bound_args(node)
    return args["condition"], args["self"], args["other"]


@register
class WhereLowering(OpLowering):
    kind = "where"
    targets = tuple(WHERE_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        from rustconv.export.ops_lowering.binary import comparison_dtype

        cond, a, b = _operands(node)
        cond_val = tensor_operand(cond, ctx, "condition", mask=True)
        mask_dtype = comparison_dtype(cond, ctx)
        if mask_dtype is None:
            raise NotSupported(
                f"its condition {cond.name} is not a comparison RustConv computes; "
                "the blob has no bool tensors"
            )
        out = tensor_val(node, "output")
        vals = [
            (role, val)
            for role, val in (("self", elementwise_operand(a, ctx, "self")),
                              ("other", elementwise_operand(b, ctx, "other")))
            if val is not None
        ]  # fmt: skip
        dtype = check_elementwise_dtypes([*vals, ("output", out)])
        if mask_dtype != dtype:
            raise NotSupported(
                f"its condition compares {mask_dtype} tensors but it selects {dtype}; "
                "one dtype per node"
            )
        check_broadcast(out, [("condition", cond_val), *vals])

    def emit(self, node: Node, builder: Builder) -> None:
        cond, a, b = _operands(node)
        where = WhereT()
        where.cond = builder.value(cond, node, "condition")
        where.a, where.aScalar = builder.operand(a, node, "self")
        where.b, where.bScalar = builder.operand(b, node, "other")
        where.output = builder.new_output(node)
        builder.add(node, Op.Where, where)


@evaluates(Op.Where)
def _evaluate(op: WhereT, env: BlobEnv) -> torch.Tensor:
    cond = env.read(op.cond) != 0
    return torch.where(cond, env.operand(op.a, op.aScalar), env.operand(op.b, op.bScalar))
