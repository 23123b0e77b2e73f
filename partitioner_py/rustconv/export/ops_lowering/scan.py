"""``rustconv.linear_scan`` -> ``LinearScan``."""

from __future__ import annotations

import torch
from torch.fx import Node

import rustconv.ops  # noqa: F401  (registers torch.ops.rustconv.linear_scan)
from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import (
    GraphContext,
    NotSupported,
    aten_op,
    bound_args,
    check_dtypes,
    tensor_val,
)
from rustconv.export.ops_lowering.evaluators import BlobEnv, evaluates
from rustconv.export.ops_lowering.operands import tensor_operand
from rustconv.export.ops_lowering.registry import OpLowering, register
from rustconv.fb.LinearScan import LinearScanT
from rustconv.fb.Op import Op

__all__ = ["SCAN_OPS", "ScanLowering", "is_scan", "scan_operands", "scan_unsupported_reason"]

SCAN_OPS = frozenset({torch.ops.rustconv.linear_scan.default})


def is_scan(node: Node) -> bool:
    return aten_op(node) in SCAN_OPS


def scan_operands(node: Node) -> tuple[Node, Node, Node]:
    """(x0, a, u) of a ``rustconv.linear_scan`` node."""
    args = bound_args(node)
    return args["x0"], args["a"], args["u"]


def scan_unsupported_reason(node: Node, ctx: GraphContext | None = None) -> str | None:
    """``None`` if RustConv can run this ``rustconv.linear_scan``."""
    if not is_scan(node):
        return "not rustconv.linear_scan"
    return ScanLowering().unsupported_reason(node, ctx or GraphContext(None))


@register
class ScanLowering(OpLowering):
    """The first-order linear recurrence; every operand may be computed inside."""

    kind = "linear_scan"
    targets = tuple(SCAN_OPS)
    is_anchor = True

    def check(self, node: Node, ctx: GraphContext) -> None:
        x0, a, u = scan_operands(node)
        named = [
            ("x0", tensor_operand(x0, ctx, "x0")),
            ("a", tensor_operand(a, ctx, "a")),
            ("u", tensor_operand(u, ctx, "u")),
            ("output", tensor_val(node, "output")),
        ]
        ranks = [val.dim() for _, val in named]
        if ranks != [2, 3, 3, 3]:
            raise NotSupported(f"ranks {ranks}, expected [2, 3, 3, 3]")
        check_dtypes(named)

    def emit(self, node: Node, builder: Builder) -> None:
        x0, a, u = scan_operands(node)
        scan = LinearScanT()
        scan.x0 = builder.value(x0, node, "x0")
        scan.a = builder.value(a, node, "a")
        scan.u = builder.value(u, node, "u")
        scan.output = builder.new_output(node)
        builder.add(node, Op.LinearScan, scan)


@evaluates(Op.LinearScan)
def _evaluate(op: LinearScanT, env: BlobEnv) -> torch.Tensor:
    return rustconv.ops.linear_scan(env.read(op.x0), env.read(op.a), env.read(op.u))
