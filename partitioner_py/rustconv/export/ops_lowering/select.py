"""``select`` (and ``select_copy``) -> ``Slice`` of one index, then ``Reshape``.

``h[:, :, -1]`` is how a model takes the last step of a recurrence as its new
state (:class:`rustconv.examples.blocks.DiagonalSSMStreaming`); it is a one-wide slice
with the dimension dropped, so it needs no op kind of its own. A negative
index counts from the end of the dimension at run time (the schema's slice
rules), so the last step of a dynamic length stays exact.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from rustconv.export.ir import IRValue
from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    bound_args,
    check_rank,
    normalize_dim,
    static_int,
    tensor_val,
)
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.slice_bounds import INT64_MAX
from rustconv.fb.Op import Op
from rustconv.fb.Reshape import ReshapeT
from rustconv.fb.Slice import SliceT
from rustconv.fb.ValueKind import ValueKind

__all__ = ["SELECT_OPS", "SelectLowering"]

_aten = torch.ops.aten
SELECT_OPS = frozenset({_aten.select.int, _aten.select_copy.int})


def _params(node: Node) -> tuple[Node, int, int]:
    args = bound_args(node)
    x = tensor_val(args["self"], "input")
    if x.dim() < 2:
        raise NotSupported("select of a 1-D tensor gives a 0-D one; RustConv values have rank >= 1")
    return args["self"], normalize_dim(args["dim"], x.dim()), static_int(args["index"], "index")


@register
class SelectLowering(OpLowering):
    kind = "select"
    targets = tuple(SELECT_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_rank([("input", x), ("output", out)])
        _params(node)

    def emit(self, node: Node, builder: Builder) -> None:
        source, dim, index = _params(node)
        x = builder.value(source, node, "input")
        like = builder.graph.values[x]
        one = type(like.dims[dim])()
        one.size, one.dynamic = 1, False
        sliced = builder.graph.add_value(
            IRValue(
                name=f"{node.name}_slice",
                dtype=like.dtype,
                shape=like.shape[:dim] + (1,) + like.shape[dim + 1 :],
                dims=like.dims[:dim] + [one] + like.dims[dim + 1 :],
                kind=ValueKind.Intermediate,
            )
        )
        op = SliceT()
        op.input, op.output, op.dim, op.step = x, sliced, dim, 1
        op.start = index
        op.end = INT64_MAX if index == -1 else index + 1
        builder.add(node, Op.Slice, op)
        reshape = ReshapeT()
        reshape.input = sliced
        reshape.output = builder.new_output(node)
        builder.add(node, Op.Reshape, reshape)
