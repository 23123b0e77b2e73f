"""``permute`` / ``transpose`` (and their ``_copy`` edge forms) -> ``Permute``."""

from __future__ import annotations

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    check_rank,
    normalize_dim,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.fb.Op import Op
from rustconv.fb.Permute import PermuteT

__all__ = ["PERMUTE_OPS", "PermuteLowering"]

_aten = torch.ops.aten
_TRANSPOSES = frozenset({_aten.transpose.int, _aten.transpose_copy.int})
PERMUTE_OPS = frozenset({_aten.permute.default, _aten.permute_copy.default, *_TRANSPOSES})


def _perm(node: Node, rank: int) -> list[int]:
    args = bound_args(node)
    if aten_op(node) in _TRANSPOSES:
        perm = list(range(rank))
        d0 = normalize_dim(args["dim0"], rank, "dim0")
        d1 = normalize_dim(args["dim1"], rank, "dim1")
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    perm = [normalize_dim(d, rank, "permutation entry") for d in args["dims"]]
    if sorted(perm) != list(range(rank)):
        raise NotSupported(f"dims {args['dims']} are not a permutation of {rank} dimensions")
    return perm


@register
class PermuteLowering(OpLowering):
    kind = "permute"
    targets = tuple(PERMUTE_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        x = tensor_operand(bound_args(node)["self"], ctx, "input")
        out = tensor_val(node, "output")
        check_elementwise_dtypes([("input", x), ("output", out)])
        check_rank([("input", x)])
        _perm(node, x.dim())

    def emit(self, node: Node, builder: Builder) -> None:
        source = bound_args(node)["self"]
        permute = PermuteT()
        permute.input = builder.value(source, node, "input")
        permute.perm = _perm(node, tensor_val(source, "input").dim())
        permute.output = builder.new_output(node)
        builder.add(node, Op.Permute, permute)


@evaluates(Op.Permute)
def _evaluate(op: PermuteT, env: BlobEnv) -> torch.Tensor:
    return env.read(op.input).permute([int(p) for p in op.perm])
