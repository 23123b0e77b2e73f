"""BatchNorm in eval mode (``_native_batch_norm_legit_no_training`` + ``getitem 0``).

In eval mode BatchNorm is a per-channel affine map with constants:
``y = x * scale + shift``, ``scale = weight / sqrt(running_var + eps)``,
``shift = bias - running_mean * scale``. Both are computed here, at export,
from the statistics (which must be constants or computed from constants, see
:mod:`.folding`), in float32:

* right after a convolution of this delegate that nothing else reads, whose
  weight (and bias) are constants, the map is folded into that convolution
  (``weight * scale`` per output channel, ``(bias - mean) * scale + beta``),
  as XNNPACK's conv + BatchNorm fusion does: the BatchNorm costs nothing;
* anywhere else over ``[B, C, N]``, it becomes a ``Mul`` and an ``Add`` by
  ``[C, 1]`` constants, which fuse into the neighbouring kernel's loops.

The node's result is a tuple (the output and two saved statistics, empty in
eval mode); only ``getitem(bn, 0)`` may read it, and the node emits nothing of
its own (:class:`~rustconv.export.ops_lowering.split.GetItemLowering` takes the
output's value from here).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

from rustconv.errors import UnsupportedGraphError
from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    tensor_val,
)
from rustconv.export.ops_lowering.folding import computes_constant
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.scalars import is_number
from rustconv.fb.Binary import BinaryT
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.Op import Op
from rustconv.fb.ValueKind import ValueKind

__all__ = ["BATCH_NORM_OPS", "BatchNormLowering"]

_aten = torch.ops.aten
BATCH_NORM_OPS = frozenset({_aten._native_batch_norm_legit_no_training.default})
_STATS = ("weight", "bias", "running_mean", "running_var")


def _stat_nodes(node: Node) -> dict[str, Node]:
    args = bound_args(node)
    return {name: args[name] for name in _STATS if isinstance(args[name], Node)}


def _only_reader(x_node: Node, bn: Node) -> bool:
    """Whether ``bn`` is the one reader of the conv result ``x_node`` carries:
    ``x_node`` is the conv, or a slice folded into it (a per-channel scale
    commutes with cutting time steps), and nothing else reads either."""
    from rustconv.export.ops_lowering.conv import is_conv
    from rustconv.export.ops_lowering.slices import SLICE_OPS

    if list(x_node.users) != [bn]:
        return False
    if is_conv(x_node):
        return True
    source = x_node.args[0] if aten_op(x_node) in SLICE_OPS and x_node.args else None
    return isinstance(source, Node) and is_conv(source) and list(source.users) == [x_node]


@register
class BatchNormLowering(OpLowering):
    kind = "batch norm"
    targets = tuple(BATCH_NORM_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        args = bound_args(node)
        x = tensor_operand(args["input"], ctx, "input")
        if x.dim() != 3:
            raise NotSupported(f"normalizes a {x.dim()}-D tensor; RustConv's is [B, C, N]")
        channels = x.shape[1]
        if not isinstance(channels, int):
            raise NotSupported("the channel count is not static")
        if not is_number(args["eps"]):
            raise NotSupported(f"eps is {args['eps']!r}, not a number")
        named = [("input", x)]
        for name in _STATS:
            stat = args[name]
            if stat is None:
                if name == "running_var" or name == "running_mean":
                    raise NotSupported(f"no {name}")
                continue
            val = tensor_val(stat, name)
            if tuple(val.shape) != (channels,):
                raise NotSupported(f"{name} has shape {tuple(val.shape)}, expected ({channels},)")
            if not (ctx.is_constant(stat) or computes_constant(stat, ctx)):
                raise NotSupported(
                    f"{name} ({stat.name}) is not a constant; RustConv computes the "
                    "normalization's scale and shift at export"
                )
            named.append((name, val))
        check_elementwise_dtypes(named)
        for user in node.users:
            if user.target is not operator.getitem or user.args[1] != 0:
                raise NotSupported(f"{user.name} reads the saved statistics, not the output")

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        return True  # a tuple: only its getitem 0 is a tensor

    def check_item(self, node: Node, index: int, ctx: GraphContext) -> None:
        reason = self.unsupported_reason(node, ctx)
        if reason is not None:
            raise NotSupported(f"its batch norm {node.name} is not supported: {reason}")
        if index != 0:
            raise NotSupported(f"reads item {index} of {node.name}, not its output")

    def export_operands(self, node: Node) -> list[Node]:
        return list(_stat_nodes(node).values())

    def emit(self, node: Node, builder: Builder) -> None:
        args = bound_args(node)
        x_node = args["input"]
        x = builder.value(x_node, node, "input")
        dtype = builder.graph.values[x].dtype
        stats = {name: self._stat(builder, node, name, args[name]) for name in _STATS}
        channels = int(tensor_val(x_node, "input").shape[1])
        one = torch.ones(channels, dtype=torch.float32)
        weight = one if stats["weight"] is None else stats["weight"]
        bias = torch.zeros_like(one) if stats["bias"] is None else stats["bias"]
        scale = weight / torch.sqrt(stats["running_var"] + float(args["eps"]))
        shift = bias - stats["running_mean"] * scale
        out = self._fold_into_conv(builder, node, x_node, x, scale, shift)
        if out is None:
            out = self._affine(builder, node, x, scale.to(dtype), shift.to(dtype))
        builder.mark_inline(node, "a batch norm's result tuple")
        producer = builder.producer(out)
        for user in node.users:  # check() allowed only getitem 0 readers
            builder.alias(user, out)
            if producer is not None:
                builder.join_handles(producer, user)

    @staticmethod
    def _stat(builder: Builder, node: Node, name: str, arg: Any) -> torch.Tensor | None:
        if arg is None:
            return None
        data = builder.constant_data(builder.value(arg, node, name))
        if data is None:
            raise UnsupportedGraphError(
                f"{name} of {node.name!r} ({arg.name!r}) is not a constant of the subgraph"
            )
        return data.to(torch.float32)

    @staticmethod
    def _fold_into_conv(
        builder: Builder,
        node: Node,
        x_node: Node,
        x: int,
        scale: torch.Tensor,
        shift: torch.Tensor,
    ) -> int | None:
        """Scales the producing conv's weight and bias; None where that is not possible."""
        conv = builder.producer(x)
        if conv is None or conv.op_type != Op.Conv1d or conv.output != x:
            return None
        if not _only_reader(x_node, node):
            return None  # the conv's own result is read elsewhere too
        weight = builder.constant_data(conv.op.weight)
        bias = None if conv.op.bias < 0 else builder.constant_data(conv.op.bias)
        if weight is None or (conv.op.bias >= 0 and bias is None):
            return None  # a weight handed in at run time
        if weight.shape[0] != scale.shape[0]:
            return None
        dtype = weight.dtype
        w = weight.to(torch.float32) * scale.view(-1, 1, 1)
        b = shift if bias is None else (bias.to(torch.float32) * scale + shift)
        conv.op.weight = builder.new_constant(f"{node.name}_weight", w.to(dtype))
        conv.op.bias = builder.new_constant(f"{node.name}_bias", b.to(dtype))
        builder.join_handles(conv, node)
        return x

    @staticmethod
    def _affine(
        builder: Builder, node: Node, x: int, scale: torch.Tensor, shift: torch.Tensor
    ) -> int:
        """``x * scale + shift`` with ``[C, 1]`` constants."""
        mul = BinaryT()
        mul.op, mul.a, mul.aScalar = BinaryOp.Mul, x, 0.0
        mul.b, mul.bScalar = builder.new_constant(f"{node.name}_scale", scale.view(-1, 1)), 0.0
        mul.output = builder.derived_value(x, f"{node.name}_scaled")
        builder.add(node, Op.Binary, mul)
        add = BinaryT()
        add.op, add.a, add.aScalar = BinaryOp.Add, mul.output, 0.0
        add.b, add.bScalar = builder.new_constant(f"{node.name}_shift", shift.view(-1, 1)), 0.0
        add.output = builder.derived_value(x, f"{node.name}_out")
        builder.add(node, Op.Binary, add)
        assert builder.graph.values[add.output].kind == ValueKind.Intermediate
        return add.output
