"""Normalisations and the reductions behind them -> ``Reduce`` and elementwise nodes.

The blob has one reduction node, ``Reduce`` (sum, mean or population
variance over listed dimensions, kept with size 1); a normalisation is
emitted as its statistics plus the elementwise nodes that apply them, which
is what the runtime fuses: each kernel gathers its reductions in a
statistics pass before its main loop, then runs the rest in its prologue,
epilogue or pass (``schema/README.md``, "Fused kernels").

=================================  ==========================================
ATen op                            blob nodes
=================================  ==========================================
``native_layer_norm``,             ``m = mean(x)``, ``v = var(x)`` over the
``layer_norm``                     normalised (trailing) dimensions, then
                                   ``(x - m) * rsqrt(v + eps) [* w] [+ b]``
``native_group_norm``,             the same over the channels and everything
``group_norm``                     after them (one group) or over everything
                                   after the channels (a group per channel,
                                   wav2vec2's ``GroupNorm(512, 512)``);
                                   ``w``, ``b`` viewed as ``[C, 1, ...]``
``rms_norm``                       ``x * rsqrt(mean(x * x) + eps) [* w]``
``mean.dim``, ``sum.dim_IntList``  ``Reduce`` (+ ``Reshape`` without keepdim)
``var.correction``, ``var.dim``    ``Reduce`` var (+ ``Mul`` by n / (n - c))
=================================  ==========================================

The edge dialect decomposes ``rms_norm`` (and transformers' ``Lfm2RMSNorm``
is written so) into ``pow(x, 2)``, ``mean.dim``, ``add``, ``rsqrt`` and
``mul``, which these lowerings and :mod:`.pow` take one by one. The variance
is two-pass in the runtime (never ``E[x^2] - E[x]^2``) and every statistic is
computed in float32, float16 models included. A ``native_*`` op's tuple is
read through ``getitem``: the result, and a LayerNorm's mean and rstd
where they have the input's dtype.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch.fx import Node

from rustconv.export.ir import IRValue
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
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.scalars import is_number
from rustconv.fb.Binary import BinaryT
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.Dim import DimT
from rustconv.fb.Op import Op
from rustconv.fb.Reduce import ReduceT
from rustconv.fb.ReduceOp import ReduceOp
from rustconv.fb.Reshape import ReshapeT
from rustconv.fb.Unary import UnaryT
from rustconv.fb.UnaryOp import UnaryOp
from rustconv.fb.ValueKind import ValueKind

__all__ = [
    "REDUCE_OPS",
    "REDUCE_REFERENCE",
    "NORM_OPS",
    "ReduceLowering",
    "LayerNormLowering",
    "GroupNormLowering",
    "RmsNormLowering",
]

_aten = torch.ops.aten


@dataclass(frozen=True)
class _Reduce:
    """One ``ReduceOp``: what it computes and the ATen overloads lowered to it."""

    code: int
    #: Its meaning over the given dimensions (kept, as size 1), in torch: the
    #: blob interpreter's evaluation of it.
    reference: Callable[[torch.Tensor, list[int]], torch.Tensor]
    aten: tuple[torch._ops.OpOverload, ...]


#: Every ``ReduceOp``, one row each.
_REDUCTIONS = (
    _Reduce(ReduceOp.Mean, lambda x, dims: x.mean(dims, keepdim=True), (_aten.mean.dim,)),
    _Reduce(ReduceOp.Sum, lambda x, dims: x.sum(dims, keepdim=True), (_aten.sum.dim_IntList,)),
    _Reduce(
        ReduceOp.Var,
        lambda x, dims: x.var(dims, correction=0, keepdim=True),
        (_aten.var.correction, _aten.var.dim),
    ),
)

#: ATen overload -> the statistic it computes.
REDUCE_OPS: dict[torch._ops.OpOverload, int] = {
    overload: row.code for row in _REDUCTIONS for overload in row.aten
}
#: ReduceOp -> what it computes (:data:`_Reduce.reference`).
REDUCE_REFERENCE: dict[int, Callable[[torch.Tensor, list[int]], torch.Tensor]] = {
    row.code: row.reference for row in _REDUCTIONS
}

_LAYER_NORM = (_aten.native_layer_norm.default, _aten.layer_norm.default)
_GROUP_NORM = (_aten.native_group_norm.default, _aten.group_norm.default)
_RMS_NORM = (_aten.rms_norm.default,)
NORM_OPS = frozenset({*_LAYER_NORM, *_GROUP_NORM, *_RMS_NORM})

# -- emitting ------------------------------------------------------------------


class _Emit:
    """Adds the blob nodes of one normalisation, every one attributed to ``node``."""

    def __init__(self, node: Node, builder: Builder) -> None:
        self.node = node
        self.builder = builder
        self.last = None  # the last IRNode added

    def _value(self, like: int, name: str, shape=None, dims=None) -> int:
        source = self.builder.graph.values[like]
        return self.builder.graph.add_value(
            IRValue(
                name=f"{self.node.name}_{name}",
                dtype=source.dtype,
                shape=tuple(shape if shape is not None else source.shape),
                dims=list(dims if dims is not None else source.dims),
                kind=ValueKind.Intermediate,
            )
        )

    def _add(self, op_type: int, op: Any) -> int:
        self.last = self.builder.add(self.node, op_type, op)
        return int(op.output)

    def reduce(self, x: int, dims: list[int], op: int, name: str) -> int:
        source = self.builder.graph.values[x]
        shape = [sympy.Integer(1) if d in dims else s for d, s in enumerate(source.shape)]
        kept = [_unit_dim() if d in dims else source.dims[d] for d in range(len(source.dims))]
        reduce = ReduceT()
        reduce.input, reduce.op, reduce.dims = x, op, list(dims)
        reduce.output = self._value(x, name, shape, kept)
        return self._add(Op.Reduce, reduce)

    def binary(self, op: int, a: int, b: int | float, like: int, name: str) -> int:
        binary = BinaryT()
        binary.op, binary.a = op, a
        if isinstance(b, int):
            binary.b = b
        else:
            binary.b, binary.bScalar = -1, float(b)
        binary.output = self._value(like, name)
        return self._add(Op.Binary, binary)

    def unary(self, op: int, x: int, name: str) -> int:
        unary = UnaryT()
        unary.op, unary.input = op, x
        unary.output = self._value(x, name)
        return self._add(Op.Unary, unary)

    def channel_view(self, v: int, rank: int) -> int:
        """``[C]`` viewed as ``[C, 1, ...]``, to broadcast over ``[B, C, ...]``."""
        source = self.builder.graph.values[v]
        extra = rank - 2
        if extra == 0:
            return v
        reshape = ReshapeT()
        reshape.input = v
        reshape.output = self._value(
            v,
            f"{source.name}_view",
            [*source.shape, *(sympy.Integer(1),) * extra],
            [*source.dims, *(_unit_dim() for _ in range(extra))],
        )
        return self._add(Op.Reshape, reshape)

    def normalise(
        self, x: int, dims: list[int], eps: float, weight: int | None, bias: int | None
    ) -> tuple[int, int, int]:
        """``(x - mean) * rsqrt(var + eps) [* weight] [+ bias]``: (result, mean, rstd)."""
        mean = self.reduce(x, dims, ReduceOp.Mean, "mean")
        var = self.reduce(x, dims, ReduceOp.Var, "var")
        centred = self.binary(BinaryOp.Sub, x, mean, x, "centred")
        rstd = self.unary(
            UnaryOp.Rsqrt, self.binary(BinaryOp.Add, var, eps, var, "var_eps"), "rstd"
        )
        y = self.binary(BinaryOp.Mul, centred, rstd, x, "normed")
        if weight is not None:
            y = self.binary(BinaryOp.Mul, y, weight, x, "scaled")
        if bias is not None:
            y = self.binary(BinaryOp.Add, y, bias, x, "shifted")
        return y, mean, rstd

    def result(self, value: int, items: dict[int, int] | None = None) -> None:
        """``value`` is the node's result; for a tuple, ``items`` its readable items."""
        builder = self.builder
        if items is None:
            builder.alias(self.node, value)
            return
        builder.mark_inline(self.node, "a normalisation's tuple (its items are read)")
        for user in self.node.users:
            index = user.args[1] if user.target is operator.getitem else None
            if index in items:
                builder.alias(user, items[index])
                if self.last is not None:
                    builder.join_handles(self.last, user)


def _unit_dim() -> DimT:
    dim = DimT()
    dim.size, dim.dynamic = 1, False
    return dim


# -- checks -------------------------------------------------------------------


def _eps(value: Any, what: str = "eps") -> float:
    if not is_number(value):
        raise NotSupported(f"{what} is {value!r}, not a number")
    return float(value)


def _optional_tensor(arg: Any, ctx: GraphContext, role: str) -> torch.Tensor | None:
    return None if arg is None else tensor_operand(arg, ctx, role)


def _check_param(val: torch.Tensor | None, shape: list, role: str) -> None:
    if val is not None and [dim_expr(s) for s in val.shape] != [dim_expr(s) for s in shape]:
        raise NotSupported(f"{role} has shape {tuple(val.shape)}, expected {tuple(shape)}")


def _output(node: Node) -> torch.Tensor:
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        val = val[0] if val else None
    if not isinstance(val, torch.Tensor):
        raise NotSupported(f"{node.name} has no tensor metadata")
    return val


def _check_tuple_items(node: Node, readable: set[int]) -> None:
    """Every reader of a ``native_*`` op's tuple picks an item RustConv gives a value."""
    for user in node.users:
        index = user.args[1] if user.target is operator.getitem else None
        if index not in readable:
            raise NotSupported(f"{user.name} reads item {index!r} of its tuple")


class _TupleNorm(OpLowering):
    """A normalisation whose ``native_*`` form returns a tuple read through ``getitem``."""

    def readable_items(self, node: Node) -> set[int]:
        """The tuple's items this kind gives values."""
        return {0}

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        return isinstance(node.meta.get("val"), (list, tuple))

    def check_item(self, node: Node, index: int, ctx: GraphContext) -> None:
        reason = self.unsupported_reason(node, ctx)
        if reason is not None:
            raise NotSupported(f"its {node.name} is not supported: {reason}")
        if index not in self.readable_items(node):
            raise NotSupported(
                f"item {index} of {node.name} ({self.kind}) is not computed by RustConv"
            )


# -- LayerNorm ----------------------------------------------------------------


def _layer_norm_args(node: Node, ctx: GraphContext):
    args = bound_args(node)
    x = tensor_operand(args["input"], ctx, "input")
    out = _output(node)
    shape = list(args["normalized_shape"])
    if not 1 <= len(shape) <= x.dim():
        raise NotSupported(f"normalized_shape {shape} for a {x.dim()}-D input")
    trailing = list(x.shape[x.dim() - len(shape) :])
    if [dim_expr(s) for s in shape] != [dim_expr(s) for s in trailing]:
        raise NotSupported(f"normalized_shape {shape} is not the input's trailing {trailing}")
    weight = _optional_tensor(args["weight"], ctx, "weight")
    bias = _optional_tensor(args["bias"], ctx, "bias")
    for val, role in ((weight, "weight"), (bias, "bias")):
        _check_param(val, shape, role)
    vals = [("input", x), ("output", out)]
    vals += [(r, v) for r, v in (("weight", weight), ("bias", bias)) if v is not None]
    check_elementwise_dtypes(vals)
    check_rank(vals)
    dims = list(range(x.dim() - len(shape), x.dim()))
    return args, dims, _eps(args["eps"])


@register
class LayerNormLowering(_TupleNorm):
    kind = "layer_norm"
    targets = _LAYER_NORM

    def readable_items(self, node: Node) -> set[int]:
        val = node.meta.get("val")
        if not isinstance(val, (list, tuple)):
            return {0}
        # The mean and rstd, where they are of the result's dtype.
        return {0} | {i for i in (1, 2) if val[i].dtype == val[0].dtype}

    def check(self, node: Node, ctx: GraphContext) -> None:
        _layer_norm_args(node, ctx)
        if isinstance(node.meta.get("val"), (list, tuple)):
            _check_tuple_items(node, self.readable_items(node))

    def emit(self, node: Node, builder: Builder) -> None:
        args, dims, eps = _layer_norm_args(node, builder.ctx)
        emit = _Emit(node, builder)
        x = builder.value(args["input"], node, "input")
        weight = None if args["weight"] is None else builder.value(args["weight"], node, "weight")
        bias = None if args["bias"] is None else builder.value(args["bias"], node, "bias")
        y, mean, rstd = emit.normalise(x, dims, eps, weight, bias)
        if isinstance(node.meta.get("val"), (list, tuple)):
            emit.result(y, {0: y, 1: mean, 2: rstd})
        else:
            emit.result(y)


# -- GroupNorm ----------------------------------------------------------------


def _group_norm_args(node: Node, ctx: GraphContext):
    args = bound_args(node)
    x = tensor_operand(args["input"], ctx, "input")
    out = _output(node)
    if not 3 <= x.dim() <= 4:
        raise NotSupported(f"a {x.dim()}-D input; RustConv normalises [B, C, N] or [B, C, H, W]")
    channels = static_int(x.shape[1], "the channel count")
    if aten_op(node) is _aten.native_group_norm.default:
        groups = static_int(args["group"], "group")
    else:
        groups = static_int(args["num_groups"], "num_groups")
    if groups == channels:
        dims = list(range(2, x.dim()))  # each channel over time
    elif groups == 1:
        dims = list(range(1, x.dim()))  # all channels together
    else:
        raise NotSupported(
            f"GroupNorm of {groups} groups of {channels} channels; RustConv normalises one "
            "group per channel or a single group"
        )
    weight = _optional_tensor(args["weight"], ctx, "weight")
    bias = _optional_tensor(args["bias"], ctx, "bias")
    for val, role in ((weight, "weight"), (bias, "bias")):
        _check_param(val, [channels], role)
    vals = [("input", x), ("output", out)]
    vals += [(r, v) for r, v in (("weight", weight), ("bias", bias)) if v is not None]
    check_elementwise_dtypes(vals)
    check_rank(vals)
    return args, dims, _eps(args["eps"]), x.dim()


@register
class GroupNormLowering(_TupleNorm):
    kind = "group_norm"
    targets = _GROUP_NORM

    def check(self, node: Node, ctx: GraphContext) -> None:
        _group_norm_args(node, ctx)
        if isinstance(node.meta.get("val"), (list, tuple)):
            _check_tuple_items(node, self.readable_items(node))

    def emit(self, node: Node, builder: Builder) -> None:
        args, dims, eps, rank = _group_norm_args(node, builder.ctx)
        emit = _Emit(node, builder)
        x = builder.value(args["input"], node, "input")
        params = []
        for role in ("weight", "bias"):
            arg = args[role]
            value = None if arg is None else builder.value(arg, node, role)
            params.append(None if value is None else emit.channel_view(value, rank))
        y, _, _ = emit.normalise(x, dims, eps, *params)
        emit.result(y, {0: y} if isinstance(node.meta.get("val"), (list, tuple)) else None)


# -- RMSNorm ------------------------------------------------------------------


@register
class RmsNormLowering(OpLowering):
    kind = "rms_norm"
    targets = _RMS_NORM

    def _args(self, node: Node, ctx: GraphContext):
        args = bound_args(node)
        x = tensor_operand(args["input"], ctx, "input")
        out = tensor_val(node, "output")
        shape = list(args["normalized_shape"])
        if not 1 <= len(shape) <= x.dim():
            raise NotSupported(f"normalized_shape {shape} for a {x.dim()}-D input")
        weight = _optional_tensor(args["weight"], ctx, "weight")
        _check_param(weight, shape, "weight")
        vals = [("input", x), ("output", out)] + (
            [("weight", weight)] if weight is not None else []
        )
        check_elementwise_dtypes(vals)
        check_rank(vals)
        eps = args["eps"]
        eps = torch.finfo(x.dtype).eps if eps is None else _eps(eps)
        return args, list(range(x.dim() - len(shape), x.dim())), eps

    def check(self, node: Node, ctx: GraphContext) -> None:
        self._args(node, ctx)

    def emit(self, node: Node, builder: Builder) -> None:
        args, dims, eps = self._args(node, builder.ctx)
        emit = _Emit(node, builder)
        x = builder.value(args["input"], node, "input")
        square = emit.binary(BinaryOp.Mul, x, x, x, "square")
        mean = emit.reduce(square, dims, ReduceOp.Mean, "mean_square")
        rms = emit.unary(UnaryOp.Rsqrt, emit.binary(BinaryOp.Add, mean, eps, mean, "eps"), "rrms")
        y = emit.binary(BinaryOp.Mul, x, rms, x, "normed")
        if args["weight"] is not None:
            weight = builder.value(args["weight"], node, "weight")
            y = emit.binary(BinaryOp.Mul, y, weight, x, "scaled")
        emit.result(y)


# -- mean / sum / var ---------------------------------------------------------


def _reduce_args(node: Node, ctx: GraphContext) -> tuple[Any, list[int], bool, float | None]:
    """(input, reduced dims, keepdim, the unbiased variance's factor or None)."""
    op = aten_op(node)
    args = bound_args(node)
    x = tensor_operand(args["self"], ctx, "input")
    out = tensor_val(node, "output")
    check_elementwise_dtypes([("input", x), ("output", out)])
    check_rank([("input", x)])
    if args.get("dtype") is not None and args["dtype"] != x.dtype:
        raise NotSupported(f"converts to {args['dtype']}; RustConv reduces in the input's dtype")
    dim = args.get("dim")
    if isinstance(dim, int):
        dim = [dim]
    dims = list(range(x.dim())) if dim is None or len(dim) == 0 else dim
    dims = sorted({normalize_dim(d, x.dim()) for d in dims})
    keepdim = bool(args.get("keepdim", False))
    if not keepdim and len(dims) == x.dim():
        raise NotSupported("reduces every dimension to a 0-d tensor, which RustConv does not hold")
    factor = None
    if op in (_aten.var.correction, _aten.var.dim):
        if op is _aten.var.dim:
            correction = 1 if args.get("unbiased", True) else 0
        else:
            correction = args.get("correction")
            correction = 1 if correction is None else correction
        if not is_number(correction):
            raise NotSupported(f"correction is {correction!r}, not a number")
        if correction != 0:
            count = 1
            for d in dims:
                size = x.shape[d]
                if not isinstance(size, int):
                    raise NotSupported(
                        "a variance with a correction over a dynamic dimension; RustConv "
                        "scales by n / (n - correction) with n known at export"
                    )
                count *= size
            factor = count / (count - correction) if count > correction else math.inf
    return args["self"], dims, keepdim, factor


@register
class ReduceLowering(OpLowering):
    kind = "reduction"
    targets = tuple(REDUCE_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        _reduce_args(node, ctx)

    def emit(self, node: Node, builder: Builder) -> None:
        source, dims, keepdim, factor = _reduce_args(node, builder.ctx)
        emit = _Emit(node, builder)
        x = builder.value(source, node, "input")
        y = emit.reduce(x, dims, REDUCE_OPS[aten_op(node)], "kept")
        if factor is not None:
            y = emit.binary(BinaryOp.Mul, y, factor, y, "unbiased")
        if keepdim:
            # Its own value, named and shaped as the node.
            builder.alias(node, y)
            return
        reshape = ReshapeT()
        reshape.input = y
        reshape.output = builder.new_output(node)
        builder.add(node, Op.Reshape, reshape)


@evaluates(Op.Reduce)
def _evaluate(op: ReduceT, env: BlobEnv) -> torch.Tensor:
    return REDUCE_REFERENCE[op.op](env.read(op.input), [int(d) for d in op.dims])
