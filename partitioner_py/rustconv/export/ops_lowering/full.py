"""Constant-filled tensors: ``full_like``/``zeros_like``/``ones_like`` -> ``Full``,
and ``scalar_tensor`` (folded into the ops that read it, see :mod:`.scalars`)."""

from __future__ import annotations

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    check_rank,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.scalars import SCALAR_TENSOR_OPS, is_number
from rustconv.fb.Full import FullT
from rustconv.fb.Op import Op

__all__ = ["FULL_OPS", "FullLowering", "ScalarTensorLowering"]

_aten = torch.ops.aten
FULL_OPS = frozenset({_aten.full_like.default, _aten.zeros_like.default, _aten.ones_like.default})


def _fill_value(node: Node) -> float:
    op = aten_op(node)
    if op is _aten.zeros_like.default:
        return 0.0
    if op is _aten.ones_like.default:
        return 1.0
    value = bound_args(node)["fill_value"]
    if isinstance(value, bool) or not is_number(value):
        raise NotSupported(f"fill value {value!r} is not a number")
    return float(value)


@register
class FullLowering(OpLowering):
    kind = "full"
    targets = tuple(FULL_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        _fill_value(node)
        like = tensor_operand(bound_args(node)["self"], ctx, "like")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("like", like), ("output", out)])
        check_rank([("output", out)])
        memory_format = bound_args(node).get("memory_format")
        if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
            raise NotSupported(f"memory_format {memory_format}; RustConv tensors are contiguous")

    def emit(self, node: Node, builder: Builder) -> None:
        full = FullT()
        full.like = builder.value(bound_args(node)["self"], node, "like")
        full.value = _fill_value(node)
        full.output = builder.new_output(node)
        builder.add(node, Op.Full, full)


@register
class ScalarTensorLowering(OpLowering):
    """``aten.scalar_tensor(v)``: a number its readers fold in; emits nothing."""

    kind = "scalar constant"
    targets = tuple(SCALAR_TENSOR_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        if not node.args or not is_number(node.args[0]) or isinstance(node.args[0], bool):
            raise NotSupported(f"scalar_tensor of {node.args[:1]!r}, not a number")

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        return True

    def emit(self, node: Node, builder: Builder) -> None:
        builder.mark_inline(node, "a scalar constant folded into its users")


@evaluates(Op.Full)
def _evaluate(op: FullT, env: BlobEnv) -> torch.Tensor:
    return torch.full(env.shape(op.like), op.value, dtype=torch.float32)
