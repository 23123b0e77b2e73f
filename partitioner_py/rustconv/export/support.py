"""Which nodes RustConv can run: the public face of :mod:`rustconv.export.ops_lowering`.

Each op kind is a registered :class:`~rustconv.export.ops_lowering.registry.OpLowering`
that owns both its support check and its blob emitter; this module keeps the
functions other code and tests have used since the first release working on
top of that registry. The same decision serves the partitioner (what to tag),
``ops_to_not_decompose`` (which must decide exactly alike on the ATen graph,
or ExecuTorch's post-lowering check fails) and ``preprocess`` (which refuses
anything that slipped through).
"""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.fx import Node

from rustconv.export.ops_lowering import GraphContext, lowering_for, reason_for
from rustconv.export.ops_lowering.common import SUPPORTED_DTYPES, aten_op
from rustconv.export.ops_lowering.conv import (
    CONV_OPS,
    PAD_OPS,
    ConvParams,
    conv_params,
    conv_unsupported_reason,
    is_conv,
    is_pad,
    pad_amounts,
    pad_unsupported_reason,
)
from rustconv.export.ops_lowering.registry import is_anchor
from rustconv.export.ops_lowering.scan import (
    SCAN_OPS,
    is_scan,
    scan_operands,
    scan_unsupported_reason,
)

__all__ = [
    "SUPPORTED_DTYPES",
    "CONV_OPS",
    "PAD_OPS",
    "SCAN_OPS",
    "ConvParams",
    "aten_op",
    "is_conv",
    "is_pad",
    "is_scan",
    "is_anchor",
    "is_rustconv_kind",
    "conv_params",
    "pad_amounts",
    "conv_unsupported_reason",
    "pad_unsupported_reason",
    "scan_unsupported_reason",
    "unsupported_reason",
    "scan_operands",
]


def is_rustconv_kind(node: Node) -> bool:
    """Whether some registered op kind claims ``node`` (supported or not)."""
    return lowering_for(node) is not None


def unsupported_reason(node: Node, ep: ExportedProgram | None = None) -> str | None:
    """``None`` if RustConv can run ``node`` on its own; otherwise why not.

    ``ep`` is the program ``node`` belongs to: it tells constants (whose
    0-d values fold into scalars) from inputs. Whether the partitioner takes a
    supported node also depends on its neighbours (see
    :meth:`rustconv.RustConvPartitioner.explain`).
    """
    return reason_for(node, GraphContext(ep))
