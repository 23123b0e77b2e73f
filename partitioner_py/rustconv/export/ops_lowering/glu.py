"""``glu`` -> two ``Slice`` halves, ``Unary Sigmoid`` and ``Binary Mul``.

``F.glu(x, dim)`` is ``a * sigmoid(b)`` with ``a, b = x.chunk(2, dim)``: the
gate of the conformer convolution module (pointwise conv, GLU over channels,
depthwise conv) and of many speech front-ends. ExecuTorch's default
decompositions usually turn it into exactly these four nodes before any
partitioner runs; it reaches us whole when another partitioner of the list
keeps it, or when ``explain()`` is asked about an ATen program. Emitting the
same four blob nodes either way lets fusion put the gate in the prologue of
the conv that reads it, or the epilogue of the one that produces it.

The halves must be known at export: the size along ``dim`` is static and even
(torch raises on an odd one at run time; a dynamic one could be odd).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    bound_args,
    check_rank,
    normalize_dim,
    tensor_val,
)
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.fb.Binary import BinaryT
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.Op import Op
from rustconv.fb.Slice import SliceT
from rustconv.fb.Unary import UnaryT
from rustconv.fb.UnaryOp import UnaryOp

__all__ = ["GLU_OPS", "GluLowering", "glu_params"]

_aten = torch.ops.aten
GLU_OPS = frozenset({_aten.glu.default})


def glu_params(node: Node) -> tuple[Node, int, int]:
    """(input, dim, half) with the halves ``[0, half)`` and ``[half, 2 * half)``."""
    args = bound_args(node)
    source = args["self"]
    x = tensor_val(source, "input")
    dim = normalize_dim(args["dim"], x.dim())
    size = x.shape[dim]
    if isinstance(size, torch.SymInt):
        maybe = size.node.maybe_as_int()
        if maybe is None:
            raise NotSupported(
                f"glu over dim {dim}, whose size {size} is dynamic; RustConv splits it "
                "into halves fixed at export"
            )
        size = maybe
    size = int(size)
    if size % 2:
        raise NotSupported(f"glu over dim {dim} of odd size {size}; it needs an even size")
    return source, dim, size // 2


@register
class GluLowering(OpLowering):
    kind = "glu"
    targets = tuple(GLU_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_rank([("input", x), ("output", out)])
        _, dim, half = glu_params(node)
        if tuple(out.shape[:dim]) != tuple(x.shape[:dim]) or out.shape[dim] != half:
            raise NotSupported(f"output {tuple(out.shape)} is not half of {tuple(x.shape)}")

    def emit(self, node: Node, builder: Builder) -> None:
        source, dim, half = glu_params(node)
        x = builder.value(source, node, "input")
        halves = []
        for which, (start, end) in (("a", (0, half)), ("b", (half, 2 * half))):
            piece = SliceT()
            piece.input, piece.dim, piece.start, piece.end, piece.step = x, dim, start, end, 1
            piece.output = builder.value_like(node, f"{node.name}_{which}")
            builder.add(node, Op.Slice, piece)
            halves.append(piece.output)
        gate = UnaryT()
        gate.op = UnaryOp.Sigmoid
        gate.input = halves[1]
        gate.output = builder.value_like(node, f"{node.name}_gate")
        builder.add(node, Op.Unary, gate)
        mul = BinaryT()
        mul.op = BinaryOp.Mul
        mul.a, mul.aScalar = halves[0], 0.0
        mul.b, mul.bScalar = gate.output, 0.0
        mul.output = builder.new_output(node)
        builder.add(node, Op.Binary, mul)
