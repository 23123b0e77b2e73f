"""``torch.cat`` -> ``Cat`` (along any dimension).

Inside a kernel the runtime reads through a ``Cat`` (each output element
comes from one input), so prepending a convolution state with ``cat``, as
ExecuTorch's LFM2 example does, costs no copy.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    bound_args,
    check_rank,
    normalize_dim,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import check_elementwise_dtypes, tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.fb.Cat import CatT
from rustconv.fb.Op import Op

__all__ = ["CAT_OPS", "CatLowering"]

CAT_OPS = frozenset({torch.ops.aten.cat.default, torch.ops.aten.concat.default})


def _dim(node: Node) -> int:
    return normalize_dim(bound_args(node)["dim"], tensor_val(node, "output").dim())


@register
class CatLowering(OpLowering):
    kind = "cat"
    targets = tuple(CAT_OPS)

    def check(self, node: Node, ctx: GraphContext) -> None:
        tensors = bound_args(node)["tensors"]
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise NotSupported(f"tensors is {tensors!r}, not a list of tensors")
        vals = [(f"input {i}", tensor_operand(t, ctx, f"input {i}")) for i, t in enumerate(tensors)]
        out = tensor_val(node, "output")
        check_elementwise_dtypes([*vals, ("output", out)])
        check_rank([*vals, ("output", out)])
        for name, val in vals:
            if val.dim() != out.dim():
                raise NotSupported(f"{name} is {val.dim()}-D, the result {out.dim()}-D")
        _dim(node)

    def emit(self, node: Node, builder: Builder) -> None:
        tensors = bound_args(node)["tensors"]
        cat = CatT()
        cat.inputs = [builder.value(t, node, f"input {i}") for i, t in enumerate(tensors)]
        cat.dim = _dim(node)
        cat.output = builder.new_output(node)
        builder.add(node, Op.Cat, cat)


@evaluates(Op.Cat)
def _evaluate(op: CatT, env: BlobEnv) -> torch.Tensor:
    return torch.cat([env.read(i) for i in op.inputs], dim=op.dim)
