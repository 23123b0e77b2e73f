"""Quantized graphs: the float form of a quantized op is left to a quantizing backend.

PT2E (``XNNPACKQuantizer``) and torchao (8da4w) express a quantized op as
its float op between ``dequantize`` and ``quantize`` nodes
(``quantized_decomposed.*``, ``torchao.*_affine``): ``dequantize(x_int8)`` ->
``conv`` -> ``quantize``, the weight ``dequantize_per_channel(w_int8)``. A
quantizing backend (XNNPACK) takes each such pattern whole and runs it in
int8. RustConv runs float ops only: taking the ``conv`` would leave its
``dequantize`` nodes outside every delegate, where ExecuTorch has no kernel
for them unless the program links the quantized kernels (``Missing out
variants: {'quantized_decomposed::dequantize_per_channel'}`` at
``to_executorch``), and would run the op in float.

So a node that reads a ``dequantize`` result is not taken, with that reason.
Float ops around a quantized region stay RustConv's: a short conv between two
dynamically quantized projections reads the first projection's float output
and hands its float output to the second's ``choose_qparams``/``quantize``,
which the quantizing backend takes with its linear. (Running int8 convs
ourselves is a separate issue.)
"""

from __future__ import annotations

from torch.fx import Node

from rustconv.export.ops_lowering.common import aten_op

__all__ = ["QUANT_NAMESPACES", "is_dequantize", "quantized_reason"]

#: Namespaces of quantize / dequantize / choose_qparams ops (PT2E, torchao).
QUANT_NAMESPACES = frozenset({"quantized_decomposed", "torchao"})


def is_quant_op(node: Node) -> bool:
    op = aten_op(node)
    return op is not None and op.namespace in QUANT_NAMESPACES


def is_dequantize(node: Node) -> bool:
    op = aten_op(node)
    return is_quant_op(node) and "dequantize" in op._schema.name


def quantized_reason(node: Node) -> str | None:
    """Why ``node`` belongs to a quantized pattern (it reads a dequantize), or None."""
    for source in node.all_input_nodes:
        if source.op == "call_function" and is_dequantize(source):
            return (
                f"it reads {source.name}, a dequantize: a quantized op (dequantize -> op "
                "-> quantize) is left to a quantizing backend such as XNNPACK, which runs "
                "it in int8 (RustConv runs float ops and would leave the dequantize "
                "without a kernel)"
            )
    return None
