"""``split`` / ``split_with_sizes`` / ``chunk`` + ``getitem`` -> one ``Slice`` per piece.

The split node itself emits nothing (its result is a list, which no blob value
can hold); each ``operator.getitem`` that picks a piece becomes a ``Slice`` of
the split's input. Piece boundaries come from the pieces' recorded shapes, so
every variant (sizes, a split size, a chunk count) is handled alike, and a
split of a dynamic axis stays exact through the Python-style bounds of
:mod:`.slice_bounds`.
"""

from __future__ import annotations

import operator

import sympy
import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    check_rank,
    dim_expr,
    normalize_dim,
    static_int,
    tensor_val,
)
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, lowering_for, register
from rustconv.export.ops_lowering.slice_bounds import encode_bound
from rustconv.fb.Op import Op
from rustconv.fb.Slice import SliceT

__all__ = ["SPLIT_OPS", "SplitLowering", "GetItemLowering", "is_split"]

_aten = torch.ops.aten
SPLIT_OPS = frozenset(
    {
        _aten.split.Tensor,
        _aten.split_copy.Tensor,
        _aten.split_with_sizes.default,
        _aten.split_with_sizes_copy.default,
        _aten.unsafe_split.Tensor,
        _aten.chunk.default,
    }
)


def is_split(node: object) -> bool:
    return isinstance(node, Node) and aten_op(node) in SPLIT_OPS


def _pieces(node: Node) -> list[torch.Tensor]:
    val = node.meta.get("val")
    if not isinstance(val, (list, tuple)) or not all(isinstance(v, torch.Tensor) for v in val):
        raise NotSupported(f"{node.name} has no per-piece tensor metadata")
    return list(val)


def piece_slice(split: Node, index: int) -> tuple[Node, int, int, int]:
    """(input, dim, start, end) of piece ``index`` of a split, schema-encoded."""
    args = bound_args(split)
    source = args["self"]
    x = tensor_val(source, "input")
    dim = normalize_dim(args.get("dim", 0), x.dim())
    pieces = _pieces(split)
    if not 0 <= index < len(pieces):
        raise NotSupported(f"piece {index} of a {len(pieces)}-way split")
    start = sum((dim_expr(p.shape[dim]) for p in pieces[:index]), sympy.Integer(0))
    end = start + dim_expr(pieces[index].shape[dim])
    size = x.shape[dim]
    return (
        source,
        dim,
        encode_bound(start, size, f"piece {index} start", is_end=False),
        encode_bound(end, size, f"piece {index} end", is_end=True),
    )


@register
class SplitLowering(OpLowering):
    kind = "split"
    targets = tuple(SPLIT_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        pieces = _pieces(node)
        check_elementwise_dtypes([("input", x), *(("piece", p) for p in pieces)])
        check_rank([("input", x)])
        for user in node.users:
            if user.target is not operator.getitem:
                raise NotSupported(f"{user.name} uses the split's list itself, not one piece")
        for i in range(len(pieces)):
            piece_slice(node, i)

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        return True

    def emit(self, node: Node, builder: Builder) -> None:
        builder.mark_inline(node, "a split (each piece is a slice of its input)")


@register
class GetItemLowering(OpLowering):
    """``operator.getitem`` of a split: the piece as a ``Slice``; of another
    op's tuple (a normalisation), whatever that op's lowering made of the item
    (:meth:`OpLowering.check_item`)."""

    kind = "split piece"
    targets = (operator.getitem,)

    def check(self, node: Node, ctx: GraphContext) -> None:
        source, index = node.args
        if not is_split(source):
            # An item of another op's tuple (a normalisation's result).
            lowering = lowering_for(source) if isinstance(source, Node) else None
            if lowering is None:
                raise NotSupported(f"getitem of {getattr(source, 'name', source)}, not of a split")
            lowering.check_item(source, static_int(index, "index"), ctx)
            return
        reason = SplitLowering().unsupported_reason(source, ctx)
        if reason is not None:
            raise NotSupported(f"its split {source.name} is not supported: {reason}")
        piece_slice(source, static_int(index, "index"))

    def emit(self, node: Node, builder: Builder) -> None:
        if builder.value_of(node) is not None:
            return  # an item its source's lowering gave a value
        split, index = node.args
        source, dim, start, end = piece_slice(split, int(index))
        op = SliceT()
        op.input = builder.value(source, node, "input")
        op.dim, op.start, op.end, op.step = dim, start, end, 1
        op.output = builder.new_output(node)
        builder.join_handles(builder.add(node, Op.Slice, op), split)
