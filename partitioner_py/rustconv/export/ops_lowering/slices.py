"""``slice`` (and ``slice_copy``) -> ``Slice``, or folded into a convolution.

Bounds follow :mod:`.slice_bounds`. A slice of the time axis right after a
stride-1 convolution that only cuts the convolution's zero padding is not a
node at all: ``conv(x, pad=(l, r))[..., s:L - c]`` with ``s <= l`` and
``c <= r`` is ``conv(x, pad=(l - s, r - c))``. This is how PyTorch writes a
causal convolution (``Conv1d(padding=k - 1)`` then ``[..., :seqlen]``, as in
transformers' LFM2), also with a dynamic sequence length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    bound_args,
    check_rank,
    dim_expr,
    normalize_dim,
    static_int,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.slice_bounds import bound_expr, encode_bound
from rustconv.fb.Op import Op
from rustconv.fb.Slice import SliceT

if TYPE_CHECKING:
    from rustconv.export.ir import IRNode

__all__ = ["SLICE_OPS", "SliceLowering", "slice_params"]

_aten = torch.ops.aten
SLICE_OPS = frozenset({_aten.slice.Tensor, _aten.slice_copy.Tensor})


def slice_params(node: Node) -> tuple[Node, int, int, int, int]:
    """(input, dim, start, end, step) in the schema's encoding."""
    args = bound_args(node)
    source = args["self"]
    x = tensor_val(source, "input")
    dim = normalize_dim(args["dim"], x.dim())
    step = static_int(args["step"], "step")
    if step < 1:
        raise NotSupported(f"step {step}; RustConv slices with step >= 1")
    size = x.shape[dim]
    start = encode_bound(args["start"], size, "start", is_end=False)
    end = encode_bound(args["end"], size, "end", is_end=True)
    return source, dim, start, end, step


@register
class SliceLowering(OpLowering):
    kind = "slice"
    targets = tuple(SLICE_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_rank([("input", x)])
        slice_params(node)

    def emit(self, node: Node, builder: Builder) -> None:
        source, dim, start, end, step = slice_params(node)
        index = builder.value(source, node, "input")
        if self._fold_into_conv(node, builder, index):
            return
        op = SliceT()
        op.input = index
        op.dim, op.start, op.end, op.step = dim, start, end, step
        op.output = builder.new_output(node)
        builder.add(node, Op.Slice, op)

    @staticmethod
    def _fold_into_conv(node: Node, builder: Builder, index: int) -> bool:
        conv = builder.producer(index)
        args = bound_args(node)
        source = args["self"]
        if conv is None or conv.op_type != Op.Conv1d or conv.op.stride != 1:
            return False
        if len(source.users) != 1:
            return False  # the unsliced output is read elsewhere too
        length = tensor_val(source, "input").shape[2]
        cut = _cuts(args, length)
        if cut is None:
            return False
        left, right = cut
        if left > conv.op.padLeft or right > conv.op.padRight:
            return False
        _shrink(conv, left, right)
        builder.alias(node, index, reshape=True)
        builder.join_handles(conv, node)
        return True


def _cuts(args: dict[str, Any], length: int | torch.SymInt) -> tuple[int, int] | None:
    """(cut from the left, cut from the right) of a unit-step time-axis slice, if static."""
    try:
        dim = normalize_dim(args["dim"], 3)
        step = static_int(args["step"], "step")
        start = bound_expr(args["start"], "start")
        end = bound_expr(args["end"], "end")
    except NotSupported:
        return None
    if dim != 2 or step != 1:
        return None
    left = sympy.Integer(0) if start is None else start
    if not (left.is_Integer and int(left) >= 0):
        return None
    if end is None or (end.is_number and int(end) >= 2**62):
        right: sympy.Expr = sympy.Integer(0)
    elif end.is_number and int(end) < 0:
        right = -end
    else:
        right = sympy.simplify(dim_expr(length) - end)
    if not (right.is_Integer and int(right) >= 0):
        return None
    return int(left), int(right)


def _shrink(conv: IRNode, left: int, right: int) -> None:
    conv.op.padLeft -= left
    conv.op.padRight -= right


@evaluates(Op.Slice)
def _evaluate(op: SliceT, env: BlobEnv) -> torch.Tensor:
    """Python-style bounds, evaluated against the run-time size."""
    index = (slice(None),) * op.dim + (slice(op.start, op.end, op.step),)
    return env.read(op.input)[index]
