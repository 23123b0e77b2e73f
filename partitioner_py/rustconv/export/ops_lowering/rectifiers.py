"""``leaky_relu`` and ``prelu`` -> ``where(x > 0, x, slope * x)``.

Both are the activations of whole families of speech models: LeakyReLU
after every conv of HiFi-GAN vocoders (transformers' ``SpeechT5HifiGan``,
``FastSpeech2ConformerHifiGan``), PReLU in ConvTasNet-style separators.
Left to another backend they split each conv chain into a call per conv;
worse, with XNNPACK after RustConv, XNNPACK's lowering of a PReLU left
alone between two of our calls fails (its channels-last pass asserts on a
PReLU whose input is not one of its own convs), so a model XNNPACK alone
lowers would not lower at all. They are written with ops the fused
kernels already run (a comparison, a multiply, a select), as ``elu`` is,
and need no op kind of their own in the blob. ``x > 0`` is the test both
ATen kernels use, so ``-0.0`` and NaN come out as in PyTorch
(``slope * x``).

``leaky_relu``'s slope is a number known at export; ``prelu``'s a weight
of one value or one per channel (dimension 1), a constant (a module's
parameter), read at export and reshaped to broadcast along the channels.
"""

from __future__ import annotations

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
from rustconv.fb.Where import WhereT

__all__ = ["LEAKY_RELU_OPS", "PRELU_OPS", "LeakyReluLowering", "PReluLowering"]

_aten = torch.ops.aten
LEAKY_RELU_OPS = frozenset({_aten.leaky_relu.default})
PRELU_OPS = frozenset({_aten.prelu.default, _aten._prelu_kernel.default})


def _check_input(node: Node, ctx: GraphContext) -> torch.Tensor:
    x = tensor_operand(bound_args(node)["self"], ctx, "input")
    out = tensor_val(node, "output")
    check_elementwise_dtypes([("input", x), ("output", out)])
    check_broadcast(out, [("input", x)])
    return x


def _emit_rectifier(node: Node, builder: Builder, slope: int, slope_scalar: float) -> None:
    """``where(x > 0, x, slope * x)``; ``slope`` a value id, or -1 and ``slope_scalar``."""
    x = builder.value(bound_args(node)["self"], node, "input")

    def binary(op: int, b: int, b_scalar: float, suffix: str, *, is_mask: bool = False) -> int:
        b_op = BinaryT()
        b_op.op, b_op.a, b_op.aScalar, b_op.b, b_op.bScalar = op, x, 0.0, b, b_scalar
        b_op.output = builder.value_like(node, f"{node.name}_{suffix}", is_mask=is_mask)
        builder.add(node, Op.Binary, b_op)
        return b_op.output

    where = WhereT()
    where.cond = binary(BinaryOp.Gt, -1, 0.0, "mask", is_mask=True)
    where.a, where.aScalar = x, 0.0
    where.b, where.bScalar = binary(BinaryOp.Mul, slope, slope_scalar, "neg"), 0.0
    where.output = builder.new_output(node)
    builder.add(node, Op.Where, where)


def _leaky_slope(node: Node) -> float:
    slope = bound_args(node)["negative_slope"]
    if not is_number(slope):
        raise NotSupported(
            f"leaky_relu's negative_slope is {slope!r}, not a number known at export"
        )
    return float(slope)


@register
class LeakyReluLowering(OpLowering):
    kind = "leaky_relu"
    targets = tuple(LEAKY_RELU_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        _leaky_slope(node)
        _check_input(node, ctx)

    def emit(self, node: Node, builder: Builder) -> None:
        _emit_rectifier(node, builder, -1, _leaky_slope(node))


@register
class PReluLowering(OpLowering):
    kind = "prelu"
    targets = tuple(PRELU_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        x = _check_input(node, ctx)
        weight = bound_args(node)["weight"]
        w = tensor_operand(weight, ctx, "weight")
        check_elementwise_dtypes([("input", x), ("weight", w)])
        channels = x.shape[1] if x.dim() >= 2 else 1
        if aten_op(node) is _aten._prelu_kernel.default:
            # The kernel form takes a weight already shaped to broadcast.
            check_broadcast(tensor_val(node, "output"), [("weight", w)])
        elif w.numel() != 1 and not (w.dim() == 1 and w.shape[0] == channels):
            raise NotSupported(
                f"weight of shape {tuple(w.shape)}; prelu takes one value or one per "
                f"channel ({channels})"
            )

    def export_operands(self, node: Node) -> list[Node]:
        return [bound_args(node)["weight"]]

    def emit(self, node: Node, builder: Builder) -> None:
        args = bound_args(node)
        weight = builder.value(args["weight"], node, "weight")
        data = builder.constant_data(weight)
        if data is None:
            raise UnsupportedGraphError(
                f"weight of {node.name!r} ({args['weight'].name!r}) is not a constant of "
                "the subgraph"
            )
        x = tensor_val(args["self"], "input")
        if data.numel() == 1:
            _emit_rectifier(node, builder, -1, float(data.reshape(()).item()))
            return
        if aten_op(node) is _aten.prelu.default:
            # One value per channel (dimension 1): shaped [C, 1, ...] to
            # broadcast against the input's trailing dimensions.
            weight = builder.new_constant(
                f"{node.name}_weight", data.reshape(-1, *([1] * (x.dim() - 2)))
            )
        _emit_rectifier(node, builder, weight, 0.0)
