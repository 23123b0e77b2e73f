"""``view`` / ``reshape`` / ``squeeze`` / ``unsqueeze`` -> ``Reshape``.

Only reshapes that remove or insert dimensions of size 1: the other dimensions
of input and output must pair up in order (compared as sympy expressions, so
a dynamic length pairs with itself). Then the element order is unchanged and
the runtime reads through the reshape with strides. A reshape that merges or
splits real dimensions (``[2, 3] -> [6]``) is left to other backends: the
blob's ``Reshape`` can state one, but the runtime runs it as a copy of a
stored value, alone in its kernel (:mod:`.conv_transpose` emits such reshapes
to interleave its phases).

A reshape right at the boundary with an op RustConv does not run (the views
``to_edge`` wraps around a linear's ``mm``: ``[1, N, D] -> [N, D] -> mm -> [1,
N, D]``) is left to that op's backend too: XNNPACK folds those views into its
fully-connected node and fails at run time when one of them is missing from
its partition. Inside RustConv's kernels such a reshape would be free anyway.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from rustconv.export.ir import regroups
from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    bound_args,
    check_rank,
    same_expr,
    shape_exprs,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.fb.Op import Op
from rustconv.fb.Reshape import ReshapeT

__all__ = ["RESHAPE_OPS", "ReshapeLowering"]

_aten = torch.ops.aten
RESHAPE_OPS = frozenset(
    {
        _aten.view.default,
        _aten.view_copy.default,
        _aten._unsafe_view.default,
        _aten.reshape.default,
        _aten.squeeze.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.squeeze_copy.default,
        _aten.squeeze_copy.dim,
        _aten.squeeze_copy.dims,
        _aten.unsqueeze.default,
        _aten.unsqueeze_copy.default,
    }
)


def _non_unit(shape) -> list:
    return [d for d in shape if d != 1]


def _foreign(node: object) -> bool:
    """A computing node no RustConv op kind claims (``mm``, ``addmm``...)."""
    from rustconv.export.ops_lowering.registry import lowering_for

    return isinstance(node, Node) and node.op == "call_function" and lowering_for(node) is None


def _check_not_at_foreign_boundary(node: Node) -> None:
    source = bound_args(node)["self"]
    if _foreign(source):
        raise NotSupported(
            f"reshapes the result of {source.name}, which RustConv does not run; "
            "left with it for its backend"
        )
    users = list(node.users)
    if users and all(_foreign(u) for u in users):
        raise NotSupported(
            f"only feeds {', '.join(u.name for u in users)}, which RustConv does not run; "
            "left with it for its backend"
        )


@register
class ReshapeLowering(OpLowering):
    kind = "reshape"
    targets = tuple(RESHAPE_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_rank([("input", x), ("output", out)])
        _check_not_at_foreign_boundary(node)
        before, after = _non_unit(shape_exprs(x)), _non_unit(shape_exprs(out))
        if len(before) != len(after) or not all(map(same_expr, before, after)):
            raise NotSupported(
                f"reshapes {tuple(shape_exprs(x))} to {tuple(shape_exprs(out))}, which is "
                "more than removing or inserting size-1 dimensions"
            )

    def emit(self, node: Node, builder: Builder) -> None:
        reshape = ReshapeT()
        reshape.input = builder.value(bound_args(node)["self"], node, "input")
        reshape.output = builder.new_output(node)
        builder.add(node, Op.Reshape, reshape)


@evaluates(Op.Reshape)
def _evaluate(op: ReshapeT, env: BlobEnv) -> torch.Tensor:
    source, target = env.dims(op.input), env.dims(op.output)
    if regroups(source, target):
        # Row-major, the one dynamic dimension taking what the others leave.
        return env.read(op.input).reshape([-1 if d.dynamic else d.size for d in target])
    return env.read(op.input).reshape(_reshaped(env.shape(op.input), source, target))


def _unit(dim) -> bool:
    return dim.size == 1 and not dim.dynamic


def _reshaped(actual: torch.Size, source: list, target: list) -> list[int]:
    """The output shape: the input's non-unit sizes, in order, into the output's
    non-unit dimensions (a ``Reshape`` that only removes or inserts 1s)."""
    sizes = iter(size for size, dim in zip(actual, source, strict=True) if not _unit(dim))
    shape = [1 if _unit(dim) else next(sizes) for dim in target]
    if next(sizes, None) is not None:
        raise ValueError("reshape: input and output non-unit dimensions do not pair up")
    return shape
