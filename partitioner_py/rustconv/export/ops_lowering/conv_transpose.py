"""Transposed 1-D convolutions (``ConvTranspose1d``), as a stride-1 conv of their phases.

A transposed convolution reaches the partitioner as ``aten.convolution`` with
``transposed=True`` (``to_edge``) or as ``aten.conv_transpose1d`` (a flow that
keeps it). With input ``x [B, Ci, T]``, weight ``W [Ci, Co/g, K]``, stride
``s``, padding ``p``, output padding ``op``, dilation ``d`` and groups ``g``::

    y_full[co, n] = sum over ci, k, j with j*s + k*d = n of x[ci, j] W[ci, co, k]
    y[t] = y_full[t + p] (+ bias),  t < T_out = (T - 1)s - 2p + d(K - 1) + op + 1

(positions past ``y_full``'s end hold the bias alone: the output padding).
Output position ``q*s + r`` only sees the taps ``k`` with ``k*d = r (mod s)``,
each at input ``j = q - m_k``, ``m_k = (k*d - r) / s``: each *phase* ``r`` is
an ordinary convolution of ``x``. All ``s`` phases together are one stride-1
``Conv1d`` with ``s*Co`` output channels, ordered ``(co, r)`` (so a group's
channels stay together and ``groups`` carries over), kernel ``M + 1`` with
``M = d(K - 1) // s`` (zero taps where a phase has fewer) and the bias
repeated per phase. Its weight is computed here, at export, from the constant
``W`` (which the blob then does not hold).

The phases are then interleaved: the conv's result ``[B, Co*s, Q]`` is
reshaped to ``[B, Co, s, Q]``, permuted to ``[B, Co, Q, s]``, reshaped to
``[B, Co, Q*s]`` and sliced to ``T_out``. Both reshapes split or merge
dimensions, which the runtime runs as copies (each its own kernel; see
:func:`rustconv.export.ir.regroups`), with the permute a pass between them.
The conv skips the columns before ``min(p // s, M)`` (left padding ``M``
less those), so the final slice drops fewer than ``s`` columns on the left.
``Q`` is ``T`` plus a constant, so a dynamic length works (the reshapes infer
it, the slice's end counts from the end); a dynamic batch does not (each
reshape infers one dynamic dimension). With ``s = 1`` there is one phase and
nothing to interleave.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    check_dtypes,
    single_int,
    tensor_val,
)
from rustconv.export.ops_lowering.folding import computes_constant
from rustconv.export.ops_lowering.operands import tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.slice_bounds import INT64_MAX
from rustconv.fb.Conv1d import Conv1dT
from rustconv.fb.Op import Op
from rustconv.fb.Permute import PermuteT
from rustconv.fb.Reshape import ReshapeT
from rustconv.fb.Slice import SliceT

__all__ = [
    "CONV_TRANSPOSE_OPS",
    "ConvTransposeLowering",
    "TransposedParams",
    "is_transposed",
    "phase_weight",
]

_aten = torch.ops.aten
#: The form a flow may keep whole; ``aten.convolution`` with ``transposed=True``
#: is :mod:`.conv`'s target, which hands it here (:func:`is_transposed`).
CONV_TRANSPOSE_OPS = frozenset({_aten.conv_transpose1d.default})


def is_transposed(node: Node) -> bool:
    """A transposed convolution in either form."""
    op = aten_op(node)
    if op in CONV_TRANSPOSE_OPS:
        return True
    return op is _aten.convolution.default and bool(bound_args(node)["transposed"])


@dataclass(frozen=True)
class TransposedParams:
    """A transposed 1-D convolution's operands and attributes."""

    input: Node
    weight: Node
    bias: Node | None
    stride: int
    padding: int
    output_padding: int
    dilation: int
    groups: int


def transposed_params(node: Node) -> TransposedParams:
    args = bound_args(node)
    ints = {
        name: single_int(args[name], name.replace("_", " "))
        for name in ("stride", "padding", "output_padding", "dilation")
    }
    groups = args["groups"]
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise NotSupported(f"groups is {groups!r}, not a constant int")
    if ints["stride"] < 1 or ints["dilation"] < 1 or groups < 1:
        raise NotSupported(
            f"stride {ints['stride']}, dilation {ints['dilation']} and groups {groups} must be >= 1"
        )
    if ints["padding"] < 0 or ints["output_padding"] < 0:
        raise NotSupported(
            f"negative padding {ints['padding']} or output padding {ints['output_padding']}"
        )
    bias = args["bias"]
    if bias is not None and not isinstance(bias, Node):
        raise NotSupported(f"bias is {bias!r}, not a tensor")
    return TransposedParams(
        input=args["input"], weight=args["weight"], bias=bias, groups=groups, **ints
    )


def phase_weight(
    weight: torch.Tensor, bias: torch.Tensor | None, stride: int, dilation: int, groups: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The stride-1 ``Conv1d`` weight ``[Co*s, Ci/g, M + 1]`` and bias ``[Co*s]``
    computing every phase of a transposed convolution with ``weight [Ci, Co/g, K]``,
    output channel ``co*s + r`` phase ``r`` of channel ``co``, its input
    zero-padded by ``M = d(K - 1) // s`` on the left (see the module docs)."""
    ci, co_g, k = weight.shape
    ci_g, s = ci // groups, stride
    m = dilation * (k - 1) // s
    # [g, Ci/g, Co/g, K] -> [g, Co/g, Ci/g, K]: a group's output channels first.
    w = weight.reshape(groups, ci_g, co_g, k).permute(0, 2, 1, 3)
    out = weight.new_zeros(groups, co_g, s, ci_g, m + 1)
    for tap in range(k):
        r, m_k = (tap * dilation) % s, (tap * dilation) // s
        out[:, :, r, :, m - m_k] = w[..., tap]
    b = None if bias is None else bias.repeat_interleave(s)
    return out.reshape(groups * co_g * s, ci_g, m + 1), b


@register
class ConvTransposeLowering(OpLowering):
    """A transposed convolution -> ``Conv1d`` of its phases, ``Reshape``,
    ``Permute``, ``Reshape``, ``Slice`` (see the module docs)."""

    kind = "conv_transpose1d"
    targets = tuple(CONV_TRANSPOSE_OPS)
    is_anchor = True

    def check(self, node: Node, ctx: GraphContext) -> None:
        p = transposed_params(node)
        x = tensor_operand(p.input, ctx, "input")
        w = tensor_val(p.weight, "weight")
        y = tensor_val(node, "output")
        if x.dim() != 3 or w.dim() != 3 or y.dim() != 3:
            raise NotSupported(
                f"not a 1-D transposed convolution (input {x.dim()}-D, weight {w.dim()}-D)"
            )
        named = [("input", x), ("weight", w), ("output", y)]
        operands = [("weight", p.weight)]
        if p.bias is not None:
            b = tensor_val(p.bias, "bias")
            if b.dim() != 1:
                raise NotSupported(f"bias is {b.dim()}-D, expected 1-D")
            named.append(("bias", b))
            operands.append(("bias", p.bias))
        check_dtypes(named)
        for role, operand in operands:
            if not (ctx.is_constant(operand) or computes_constant(operand, ctx)):
                raise NotSupported(
                    f"its {role} {operand.name} is not a constant; RustConv computes a "
                    "transposed convolution's phase weights at export"
                )
        if not all(isinstance(d, int) for d in (*w.shape, x.shape[1])):
            raise NotSupported("the channel counts or the kernel size are not static")
        if x.shape[1] != w.shape[0] or w.shape[0] % p.groups != 0:
            raise NotSupported(
                f"channels do not match groups={p.groups}: input {tuple(x.shape)}, "
                f"weight {tuple(w.shape)}"
            )
        if p.stride > 1 and not isinstance(x.shape[0], int):
            raise NotSupported(
                "the batch size is dynamic; interleaving the phases reshapes with the "
                "length as the one dynamic dimension"
            )

    def export_operands(self, node: Node) -> list[Node]:
        p = transposed_params(node)
        return [p.weight] + ([p.bias] if p.bias is not None else [])

    def emit(self, node: Node, builder: Builder) -> None:
        p = transposed_params(node)
        weight = _constant(builder, p.weight, node, "weight")
        bias = None if p.bias is None else _constant(builder, p.bias, node, "bias")
        s, dtype = p.stride, weight.dtype
        wc, bc = phase_weight(weight, bias, s, p.dilation, p.groups)
        x_val, y_val = tensor_val(p.input, "input"), tensor_val(node, "output")
        batch, length = x_val.shape[0], x_val.shape[2]
        channels = int(y_val.shape[1])
        m = wc.shape[2] - 1
        # The output's positions p .. p + T_out of y_full are the phase
        # columns skip .. q_end - 1; q_end - T is a constant (module docs).
        skip = min(p.padding // s, m)
        k = int(weight.shape[2])
        tail = -s - p.padding + p.dilation * (k - 1) + p.output_padding + 1  # p + T_out - T*s
        right = max(-(-tail // s), 0)
        columns = length - skip + right

        conv = Conv1dT()
        conv.input = builder.value(p.input, node, "input")
        conv.weight = builder.new_constant(f"{node.name}_phase_weight", wc)
        conv.bias = -1 if bc is None else builder.new_constant(f"{node.name}_phase_bias", bc)
        conv.stride, conv.dilation, conv.groups = 1, 1, p.groups
        conv.padLeft, conv.padRight = m - skip, right
        conv.output = builder.new_intermediate(
            f"{node.name}_phases", dtype, [batch, channels * s, columns]
        )
        builder.add(node, Op.Conv1d, conv)
        result = conv.output
        if s > 1:
            split = _node(builder, node, "split", ReshapeT(), result, [batch, channels, s, columns])
            permute = PermuteT()
            permute.perm = [0, 1, 3, 2]
            swapped = _node(builder, node, "swapped", permute, split, [batch, channels, columns, s])
            result = _node(
                builder, node, "interleaved", ReshapeT(), swapped, [batch, channels, columns * s]
            )
        start = p.padding - skip * s
        cut = right * s - tail  # from the end: constant, whatever T is
        if start == 0 and cut == 0:
            builder.alias(node, result)
            return
        crop = SliceT()
        crop.input, crop.dim, crop.step = result, 2, 1
        crop.start, crop.end = start, -cut if cut > 0 else INT64_MAX
        crop.output = builder.new_output(node)
        builder.add(node, Op.Slice, crop)


def _node(builder: Builder, node: Node, what: str, op: Any, source: int, shape: list) -> int:
    """Adds ``op`` (a ``Reshape`` or ``Permute``) reading ``source`` into a new
    value ``<node>_<what>`` of ``shape``; returns it."""
    op.input = source
    op.output = builder.new_intermediate(
        f"{node.name}_{what}", builder.graph.values[source].dtype, shape
    )
    builder.add(node, Op.Permute if isinstance(op, PermuteT) else Op.Reshape, op)
    return op.output


def _constant(builder: Builder, arg: Node, node: Node, role: str) -> torch.Tensor:
    data = builder.constant_data(builder.value(arg, node, role))
    if data is None:
        raise UnsupportedGraphError(
            f"the {role} of {node.name!r} ({arg.name!r}) is not a constant of the subgraph; "
            "RustConv computes a transposed convolution's phase weights at export"
        )
    return data
