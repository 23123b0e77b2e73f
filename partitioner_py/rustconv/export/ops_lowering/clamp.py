"""``clamp`` / ``clamp_min`` / ``clamp_max`` / ``hardtanh`` / ``relu6`` -> ``Clamp``.

Only constant (number) bounds: a bound that is a tensor would be a broadcast
binary op, which ``maximum``/``minimum`` already express.
"""

from __future__ import annotations

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
    tensor_operand,
)
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.scalars import is_number
from rustconv.fb.Clamp import ClampT
from rustconv.fb.Op import Op

__all__ = ["CLAMP_OPS", "ClampLowering"]

_aten = torch.ops.aten
CLAMP_OPS = frozenset(
    {
        _aten.clamp.default,
        _aten.clamp.Tensor,
        _aten.clamp_min.default,
        _aten.clamp_max.default,
        _aten.hardtanh.default,
        _aten.relu6.default,
    }
)


def _bounds(node: Node) -> tuple[Any, Any]:
    """(min, max) as numbers or None; :class:`NotSupported` for anything else."""
    op = aten_op(node)
    args = bound_args(node)
    if op is _aten.clamp.Tensor:
        raise NotSupported("clamp with tensor bounds; use maximum/minimum")
    if op is _aten.clamp.default:
        bounds = args["min"], args["max"]
    elif op is _aten.clamp_min.default:
        bounds = args["min"], None
    elif op is _aten.clamp_max.default:
        bounds = None, args["max"]
    elif op is _aten.hardtanh.default:
        bounds = args["min_val"], args["max_val"]
    else:  # relu6
        bounds = 0.0, 6.0
    for bound in bounds:
        if bound is not None and (isinstance(bound, bool) or not is_number(bound)):
            raise NotSupported(f"clamp bound {bound!r} is not a number")
    return bounds


@register
class ClampLowering(OpLowering):
    kind = "clamp"
    targets = tuple(CLAMP_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        _bounds(node)
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_broadcast(out, [("input", x)])

    def emit(self, node: Node, builder: Builder) -> None:
        low, high = _bounds(node)
        clamp = ClampT()
        clamp.input = builder.value(bound_args(node)["self"], node, "input")
        clamp.hasMin, clamp.min = low is not None, float(low if low is not None else 0.0)
        clamp.hasMax, clamp.max = high is not None, float(high if high is not None else 0.0)
        clamp.output = builder.new_output(node)
        builder.add(node, Op.Clamp, clamp)


@evaluates(Op.Clamp)
def _evaluate(op: ClampT, env: BlobEnv) -> torch.Tensor:
    low = op.min if op.hasMin else None
    high = op.max if op.hasMax else None
    x = env.read(op.input)
    return x.clone() if low is None and high is None else torch.clamp(x, low, high)
