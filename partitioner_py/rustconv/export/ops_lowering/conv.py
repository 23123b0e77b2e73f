"""1-D convolutions, and zero pads folded into them.

A convolution reaches the partitioner in one of three forms, depending on the
lowering flow (``to_edge`` decomposes ``aten.conv1d`` to ``aten.convolution``;
``to_edge_transform_and_lower`` with this partitioner alone keeps
``aten.conv1d``):

* ``aten.convolution.default``  - explicit symmetric padding, ``transposed`` flag
  (a transposed one is handed to :mod:`.conv_transpose`)
* ``aten.conv1d.default``       - explicit symmetric padding
* ``aten.conv1d.padding``       - ``padding="same"`` / ``"valid"``

PyTorch decomposes ``padding="same"`` with an even total padding into
``aten.constant_pad_nd`` (the extra element on the right) followed by a
symmetric convolution. Such a zero pad of the last dimension feeding only a
supported convolution is taken too and folded into ``pad_left``/``pad_right``;
this also captures causal convolutions written as ``F.pad(x, (k - 1, 0))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from rustconv.errors import UnsupportedGraphError
from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    check_dtypes,
    single_int,
    tensor_val,
)
from rustconv.export.ops_lowering.conv_transpose import ConvTransposeLowering, is_transposed
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, computed_inside_reason, register
from rustconv.fb.Conv1d import Conv1dT
from rustconv.fb.Op import Op
from rustconv.fb.ValueKind import ValueKind

__all__ = [
    "CONV_OPS",
    "PAD_OPS",
    "ConvParams",
    "ConvLowering",
    "PadLowering",
    "is_conv",
    "is_pad",
    "conv_params",
    "pad_amounts",
    "conv_unsupported_reason",
    "pad_unsupported_reason",
]

_aten = torch.ops.aten
CONV_OPS = frozenset({_aten.convolution.default, _aten.conv1d.default, _aten.conv1d.padding})
PAD_OPS = frozenset({_aten.constant_pad_nd.default})


def is_conv(node: Node) -> bool:
    return aten_op(node) in CONV_OPS


def is_pad(node: Node) -> bool:
    return aten_op(node) in PAD_OPS


def _is_static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


@dataclass(frozen=True)
class ConvParams:
    """A 1-D convolution's operands and attributes, independent of its ATen form.

    ``pad_left``/``pad_right`` are the convolution's own padding; a fused
    ``constant_pad_nd`` is added by the emitter, not here.
    """

    input: Node
    weight: Node
    bias: Node | None
    stride: int
    pad_left: int
    pad_right: int
    dilation: int
    groups: int


def conv_params(node: Node) -> ConvParams:
    """Reads a conv node in any of its three forms; ``ValueError`` if it is none."""
    try:
        return _conv_params(node)
    except NotSupported as e:
        raise ValueError(f"{node.name}: {e}") from None


def _conv_params(node: Node) -> ConvParams:
    op = aten_op(node)
    if op not in CONV_OPS:
        raise NotSupported(f"{op} is not a convolution")
    args = bound_args(node)
    if op is _aten.convolution.default and args["transposed"]:
        raise NotSupported("a transposed convolution (lowered by conv_transpose)")
    weight_val = tensor_val(args["weight"], "weight")
    stride = single_int(args["stride"], "stride")
    dilation = single_int(args["dilation"], "dilation")
    groups = args["groups"]
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise NotSupported(f"groups is {groups!r}, not a constant int")
    if stride < 1 or dilation < 1 or groups < 1:
        raise NotSupported(f"stride {stride}, dilation {dilation} and groups {groups} must be >= 1")

    padding = args["padding"]
    if isinstance(padding, str):
        if padding == "valid":
            pad_left = pad_right = 0
        elif padding == "same":
            if weight_val.dim() != 3 or not _is_static(weight_val.shape):
                raise NotSupported("padding='same' needs a static 3-D weight")
            # PyTorch's split (aten/src/ATen/native/Convolution.cpp,
            # _convolution_mode): the odd element goes to the right.
            total = dilation * (weight_val.shape[2] - 1)
            pad_left = total // 2
            pad_right = total - pad_left
        else:
            raise NotSupported(f"padding mode {padding!r} is not supported")
    else:
        pad_left = pad_right = single_int(padding, "padding")
        if pad_left < 0:
            raise NotSupported(f"negative padding {pad_left}")

    bias = args["bias"]
    if bias is not None and not isinstance(bias, Node):
        raise NotSupported(f"bias is {bias!r}, not a tensor")
    return ConvParams(
        input=args["input"],
        weight=args["weight"],
        bias=bias,
        stride=stride,
        pad_left=pad_left,
        pad_right=pad_right,
        dilation=dilation,
        groups=groups,
    )


def conv_unsupported_reason(node: Node, ctx: GraphContext | None = None) -> str | None:
    """``None`` if RustConv can run this convolution, else a human-readable reason."""
    return ConvLowering().unsupported_reason(node, ctx or GraphContext(None))


def pad_amounts(node: Node) -> tuple[int, int]:
    """(left, right) of a ``constant_pad_nd`` that only pads the last dimension."""
    try:
        return _pad_amounts(node)
    except NotSupported as e:
        raise ValueError(f"{node.name}: {e}") from None


def _pad_amounts(node: Node) -> tuple[int, int]:
    args = bound_args(node)
    pad = args["pad"]
    if not isinstance(pad, (list, tuple)) or len(pad) != 2:
        raise NotSupported(f"pads {pad!r}, not just the last dimension")
    left, right = pad
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in (left, right)):
        raise NotSupported(f"pad amounts {pad!r} are not constant ints")
    if left < 0 or right < 0:
        raise NotSupported(f"negative pad {pad!r} (cropping) cannot be fused")
    if args["value"] != 0:
        raise NotSupported(f"pad value {args['value']!r} is not zero")
    return left, right


def pad_unsupported_reason(node: Node, ctx: GraphContext | None = None) -> str | None:
    """``None`` if this pad can be folded into the single conv that consumes it."""
    return PadLowering().unsupported_reason(node, ctx or GraphContext(None))


def foldable_pad(node: Any, ctx: GraphContext) -> bool:
    return isinstance(node, Node) and is_pad(node) and PadLowering().check_quiet(node, ctx)


@register
class ConvLowering(OpLowering):
    """``aten.convolution`` / ``aten.conv1d`` on a 3-D input -> ``Conv1d``."""

    kind = "conv1d"
    targets = tuple(CONV_OPS)
    is_anchor = True

    def check(self, node: Node, ctx: GraphContext) -> None:
        if is_transposed(node):
            _TRANSPOSED.check(node, ctx)
            return
        p = _conv_params(node)
        if foldable_pad(p.input, ctx):
            x = tensor_val(p.input, "input")
        else:
            x = tensor_operand(p.input, ctx, "input")
        w = tensor_val(p.weight, "weight")
        y = tensor_val(node, "output")
        if x.dim() != 3 or w.dim() != 3 or y.dim() != 3:
            raise NotSupported(f"not a 1-D convolution (input {x.dim()}-D, weight {w.dim()}-D)")
        named = [("input", x), ("weight", w), ("output", y)]
        if p.bias is not None:
            b = tensor_val(p.bias, "bias")
            if b.dim() != 1:
                raise NotSupported(f"bias is {b.dim()}-D, expected 1-D")
            named.append(("bias", b))
        check_dtypes(named)
        if not _is_static(w.shape):
            raise NotSupported(f"weight shape {tuple(w.shape)} is not static")
        if not isinstance(x.shape[1], int):
            raise NotSupported("input channel count is not static")
        if x.shape[1] != w.shape[1] * p.groups or w.shape[0] % p.groups != 0:
            raise NotSupported(
                f"channels do not match groups={p.groups}: input {tuple(x.shape)}, "
                f"weight {tuple(w.shape)}"
            )

    def outside_operands(self, node: Node) -> list[Node]:
        if is_transposed(node):
            return _TRANSPOSED.outside_operands(node)
        p = _conv_params(node)
        return [p.weight] + ([p.bias] if p.bias is not None else [])

    def export_operands(self, node: Node) -> list[Node]:
        if is_transposed(node):
            return _TRANSPOSED.export_operands(node)
        return []

    def emit(self, node: Node, builder: Builder) -> None:
        if is_transposed(node):
            _TRANSPOSED.emit(node, builder)
            return
        p = _conv_params(node)
        source, extra_left, extra_right, pad = p.input, 0, 0, None
        if foldable_pad(source, builder.ctx):
            pad = source
            extra_left, extra_right = _pad_amounts(pad)
            source = pad.args[0]

        conv = Conv1dT()
        conv.input = builder.value(source, node, "input")
        conv.weight = self._weight(builder, p.weight, node, "weight")
        conv.bias = -1 if p.bias is None else self._weight(builder, p.bias, node, "bias")
        conv.stride = p.stride
        conv.padLeft = p.pad_left + extra_left
        conv.padRight = p.pad_right + extra_right
        conv.dilation = p.dilation
        conv.groups = p.groups
        conv.output = builder.new_output(node)
        ir = builder.add(node, Op.Conv1d, conv)
        if pad is not None:
            # A pad from decomposing conv1d(padding="same") shares the conv's handle.
            ir.debug_handles = []
            builder.join_handles(ir, pad)
            builder.join_handles(ir, node)

    @staticmethod
    def _weight(builder: Builder, arg: Node, node: Node, role: str) -> int:
        index = builder.value(arg, node, role)
        kind = builder.graph.values[index].kind
        reason = computed_inside_reason(
            arg, node, kind not in (ValueKind.Input, ValueKind.Constant)
        )
        if reason is not None:
            raise UnsupportedGraphError(f"the {role} of {node.name!r}: {reason}")
        return index


#: ``aten.convolution`` with ``transposed=True`` is this module's target; it
#: hands such a node to the lowering of ``aten.conv_transpose1d``.
_TRANSPOSED = ConvTransposeLowering()


@register
class PadLowering(OpLowering):
    """A zero ``constant_pad_nd`` of the time axis feeding one conv: no node."""

    kind = "pad into conv1d"
    targets = tuple(PAD_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        _pad_amounts(node)
        x = tensor_val(node.args[0], "input")
        if x.dim() != 3:
            raise NotSupported(f"pads a {x.dim()}-D tensor, expected 3-D")
        users = list(node.users)
        if len(users) != 1:
            raise NotSupported(f"has {len(users)} users; only a single conv user fuses")
        (user,) = users
        if is_conv(user) and is_transposed(user):
            raise NotSupported(
                f"its user {user.name} is a transposed convolution, which folds no pad"
            )
        if not is_conv(user) or ConvLowering().unsupported_reason(user, ctx) is not None:
            raise NotSupported(f"its user {user.name} is not a supported convolution")
        if _conv_params(user).input is not node:
            raise NotSupported(f"it is not the input of {user.name}")
        tensor_operand(node.args[0], ctx, "input")

    def check_quiet(self, node: Node, ctx: GraphContext) -> bool:
        try:
            _pad_amounts(node)
            x = tensor_val(node.args[0], "input")
            users = list(node.users)
            return x.dim() == 3 and len(users) == 1 and _conv_params(users[0]).input is node
        except NotSupported:
            return False

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        return self.check_quiet(node, ctx)

    def emit(self, node: Node, builder: Builder) -> None:
        builder.mark_inline(node, "a zero pad folded into its convolution")


@evaluates(Op.Conv1d)
def _evaluate(op: Conv1dT, env: BlobEnv) -> torch.Tensor:
    """The explicit left and right padding, then PyTorch's ``conv1d``."""
    x = F.pad(env.read(op.input), (op.padLeft, op.padRight))
    bias = None if op.bias < 0 else env.read(op.bias)
    return F.conv1d(x, env.read(op.weight), bias, op.stride, 0, op.dilation, op.groups)
