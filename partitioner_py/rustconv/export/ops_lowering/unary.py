"""One-input elementwise ops -> ``Unary``, and copies -> ``Unary Identity``.

Copies (``clone``, ``alias``, ``contiguous``, a same-dtype ``_to_copy`` and
their edge ``dim_order_ops`` forms) change nothing the blob can express: every
RustConv value is contiguous. A copy of a value computed in the delegate is
therefore an alias (no node); only a copy of a delegate input or constant
emits ``Identity``, which the runtime materialises as a copy where needed.
Two special cases fold away entirely: a copy of a scalar constant (it is read
as a number, see :mod:`.scalars`) and the cast of a comparison's mask to its
float dtype (the blob's masks already are 1.0/0.0 in that dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    check_rank,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import (
    check_broadcast,
    check_elementwise_dtypes,
    tensor_operand,
)
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.export.ops_lowering.scalars import COPY_OPS, is_number, is_scalar_like
from rustconv.fb.Op import Op
from rustconv.fb.Unary import UnaryT
from rustconv.fb.UnaryOp import UnaryOp

__all__ = ["UNARY_OPS", "UNARY_REFERENCE", "UnaryLowering", "IdentityLowering"]

_aten = torch.ops.aten


@dataclass(frozen=True)
class _Unary:
    """One ``UnaryOp``: what it computes and the ATen overload lowered to it."""

    code: int
    #: Its meaning, in torch: the blob interpreter's evaluation of it.
    reference: Callable[[torch.Tensor], torch.Tensor]
    #: None where the code is reached otherwise (said beside its row).
    aten: torch._ops.OpOverload | None = None


#: Every ``UnaryOp``, one row each: adding one to the schema is one row here
#: (and one in the runtime's ``elementwise_ops!``).
_UNARY = (
    _Unary(UnaryOp.Identity, torch.clone),  # copies of inputs and constants (IdentityLowering)
    _Unary(UnaryOp.Neg, torch.neg, _aten.neg.default),
    _Unary(UnaryOp.Abs, torch.abs, _aten.abs.default),
    _Unary(UnaryOp.Relu, torch.relu, _aten.relu.default),
    _Unary(UnaryOp.Sigmoid, torch.sigmoid, _aten.sigmoid.default),
    _Unary(UnaryOp.Tanh, torch.tanh, _aten.tanh.default),
    _Unary(UnaryOp.Silu, F.silu, _aten.silu.default),
    _Unary(UnaryOp.Gelu, F.gelu, _aten.gelu.default),
    _Unary(UnaryOp.GeluTanh, partial(F.gelu, approximate="tanh")),  # gelu's approximate="tanh"
    _Unary(UnaryOp.Exp, torch.exp, _aten.exp.default),
    _Unary(UnaryOp.Log, torch.log, _aten.log.default),
    _Unary(UnaryOp.Log1p, torch.log1p, _aten.log1p.default),
    _Unary(UnaryOp.Softplus, F.softplus, _aten.softplus.default),
    _Unary(UnaryOp.Sqrt, torch.sqrt, _aten.sqrt.default),
    _Unary(UnaryOp.Rsqrt, torch.rsqrt, _aten.rsqrt.default),
    _Unary(UnaryOp.Reciprocal, torch.reciprocal, _aten.reciprocal.default),
    _Unary(UnaryOp.Sin, torch.sin, _aten.sin.default),
    _Unary(UnaryOp.Cos, torch.cos, _aten.cos.default),
)

#: ATen overload -> UnaryOp (gelu is resolved from its ``approximate`` argument).
UNARY_OPS: dict[torch._ops.OpOverload, int] = {
    row.aten: row.code for row in _UNARY if row.aten is not None
}
#: UnaryOp -> what it computes (:data:`_Unary.reference`).
UNARY_REFERENCE: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    row.code: row.reference for row in _UNARY
}

_GELU = {"none": UnaryOp.Gelu, "tanh": UnaryOp.GeluTanh}


def _unary_op(node: Node) -> int:
    op = aten_op(node)
    code = UNARY_OPS[op]
    args = bound_args(node)
    if op is _aten.gelu.default:
        approximate = args["approximate"]
        if approximate not in _GELU:
            raise NotSupported(f"gelu approximate={approximate!r} is not supported")
        return _GELU[approximate]
    if op is _aten.softplus.default:
        beta, threshold = args["beta"], args["threshold"]
        if not (is_number(beta) and is_number(threshold)) or (beta, threshold) != (1, 20):
            raise NotSupported(
                f"softplus with beta={beta!r}, threshold={threshold!r}; RustConv "
                "implements beta=1, threshold=20 (the defaults)"
            )
    return code


@register
class UnaryLowering(OpLowering):
    kind = "unary"
    targets = tuple(UNARY_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        _unary_op(node)
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_broadcast(out, [("input", x)])

    def emit(self, node: Node, builder: Builder) -> None:
        op = UnaryT()
        op.op = _unary_op(node)
        op.input = builder.value(bound_args(node)["self"], node, "input")
        op.output = builder.new_output(node)
        builder.add(node, Op.Unary, op)


def _mask_cast_source(node: Node, ctx: GraphContext) -> Node | None:
    """The comparison a bool -> float cast reads, if ``node`` is such a cast."""
    from rustconv.export.ops_lowering.binary import comparison_dtype

    source = node.args[0] if node.args else None
    out = node.meta.get("val")
    if not isinstance(source, Node) or not isinstance(out, torch.Tensor):
        return None
    if tensor_val(source, "input").dtype != torch.bool:
        return None
    if comparison_dtype(source, ctx) != out.dtype:
        raise NotSupported(
            f"casts the mask {source.name} to {out.dtype}; RustConv's masks are "
            "1.0/0.0 in the dtype of the compared tensors and can only be cast to it"
        )
    return source


@register
class IdentityLowering(OpLowering):
    """Copies: alias, ``Identity``, or folded (scalars, mask casts)."""

    kind = "copy"
    targets = tuple(COPY_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        out = tensor_val(node, "output")
        args = bound_args(node)
        if out.dim() == 0 and is_scalar_like(args["self"], ctx):
            return
        if _mask_cast_source(node, ctx) is not None:
            return
        x = tensor_operand(args["self"], ctx, "input")
        if x.dtype != out.dtype:
            raise NotSupported(f"converts {x.dtype} to {out.dtype}; only same-dtype copies")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_rank([("input", x)])
        memory_format = args.get("memory_format")
        if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
            raise NotSupported(f"memory_format {memory_format}; RustConv tensors are contiguous")
        dim_order = args.get("dim_order")
        if dim_order is not None and list(dim_order) != list(range(out.dim())):
            raise NotSupported(f"dim_order {list(dim_order)}; RustConv tensors are contiguous")

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        out = node.meta.get("val")
        return (
            isinstance(out, torch.Tensor)
            and out.dim() == 0
            and bool(node.args)
            and is_scalar_like(node.args[0], ctx)
        )

    def emit(self, node: Node, builder: Builder) -> None:
        if self.inline_only(node, builder.ctx):
            builder.mark_inline(node, "a scalar constant folded into its users")
            return
        source = builder.value(bound_args(node)["self"], node, "input")
        if builder.producer(source) is None:
            # A copy of an input or constant is a real copy.
            builder.identity(node, source)
            return
        if _mask_cast_source(node, builder.ctx) is not None:
            # From here on the mask is also read as a number.
            builder.graph.values[source].is_mask = False
        builder.alias(node, source)
        producer = builder.producer(source)
        assert producer is not None
        builder.join_handles(producer, node)


@evaluates(Op.Unary)
def _evaluate(op: UnaryT, env: BlobEnv) -> torch.Tensor:
    return UNARY_REFERENCE[op.op](env.read(op.input))
