"""SymInt nodes (``x.size(-1)`` and arithmetic on it): taken, never emitted.

With a dynamic sequence length, a bound such as ``[..., :seqlen]`` is an
``aten.sym_size.int`` node (maybe followed by ``operator.sub``...) feeding the
slice. The blob encodes such bounds from the slice's recorded shapes (see
:mod:`.slice_bounds`), so these nodes compute nothing at run time; they are
taken into the delegate with their users only so that no SymInt crosses the
delegate boundary (the runtime's inputs are tensors).
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import GraphContext, NotSupported
from rustconv.export.ops_lowering.registry import OpLowering, register

__all__ = ["SYMINT_OPS", "SymIntLowering"]

SYMINT_OPS = (
    torch.ops.aten.sym_size.int,
    operator.add,
    operator.sub,
    operator.mul,
    operator.floordiv,
    operator.neg,
)


@register
class SymIntLowering(OpLowering):
    kind = "symint"
    targets = SYMINT_OPS

    def check(self, node: Node, ctx: GraphContext) -> None:
        val = node.meta.get("val")
        if isinstance(val, bool) or not isinstance(val, (int, torch.SymInt)):
            raise NotSupported(f"{node.name} computes {type(val).__name__}, not a size")
        for arg in node.args:
            if isinstance(arg, Node) and not isinstance(
                arg.meta.get("val"), (int, torch.SymInt, torch.Tensor)
            ):
                raise NotSupported(f"{arg.name} is not a tensor or a size")

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        return True

    def emit(self, node: Node, builder: Builder) -> None:
        builder.mark_inline(node, "a size, read from shapes at export")
