"""Every op kind RustConv lowers, one module per family, found through a registry.

========================  =============================================  ============
module                    ATen ops                                       blob op
========================  =============================================  ============
:mod:`.conv`              convolution, conv1d; zero constant_pad_nd      Conv1d
:mod:`.conv_transpose`    conv_transpose1d, convolution transposed       Conv1d, Reshape,
                          (a stride-1 conv of its phases, interleaved)   Permute, Slice
:mod:`.scan`              rustconv.linear_scan                           LinearScan
:mod:`.unary`             neg, abs, relu, sigmoid, tanh, silu, gelu,     Unary
                          exp, log, log1p, softplus, sqrt, rsqrt,
                          reciprocal, sin, cos; clone/alias/_to_copy
                          (Identity)
:mod:`.binary`            add, sub, rsub, mul, div, maximum, minimum,    Binary
                          gt, ge, lt, le, eq, ne
:mod:`.where`             where                                          Where
:mod:`.clamp`             clamp, clamp_min/max, hardtanh, relu6          Clamp
:mod:`.full`              full_like, zeros_like, ones_like;              Full
                          scalar_tensor (folded)
:mod:`.permute`           permute, transpose                             Permute
:mod:`.slices`            slice (or folded into a conv)                  Slice
:mod:`.split`             split, split_with_sizes, chunk + getitem       Slice
:mod:`.elu`               elu (alpha, scale, input_scale numbers)        Binary, Unary,
                                                                         Where
:mod:`.rectifiers`        leaky_relu, prelu (constant weight)            Binary, Where
:mod:`.glu`               glu (static, even size along dim)              Slice, Unary,
                                                                         Binary
:mod:`.select`            select (one index)                             Slice, Reshape
:mod:`.reshape`           view, reshape, squeeze, unsqueeze              Reshape
:mod:`.cat`               cat                                            Cat
:mod:`.pow`               pow with exponent 2, 0.5, -0.5 or -1           Binary, Unary
:mod:`.norm`              native_layer_norm, native_group_norm,          Reduce and
                          rms_norm (and their composite forms);          elementwise
                          mean.dim, sum.dim_IntList, var                 nodes
:mod:`.symint`            sym_size and SymInt arithmetic                 (none)
:mod:`.batch_norm`        _native_batch_norm_legit_no_training (eval)    folded into the
                                                                         conv, or Binary
:mod:`.folding`           any pure op on constants only                  Constant (evaluated)
========================  =============================================  ============

Importing this package imports every module in it (found in its folder, in
name order), which registers them all. Each emits through the
:class:`~rustconv.export.ops_lowering.builder.Builder` protocol, which
``rustconv.export.lowering.LoweringBuilder`` implements, and states what its
blob op computes through :mod:`.evaluators` (``@evaluates``), which the blob
interpreter (``rustconv.devtools.reference``) reads.

Adding an op kind is its module here: its :class:`OpLowering`
(``@register``; ``is_anchor = True`` for an op a fused kernel is built
around) and, for a new blob op, its evaluator (``@evaluates``). A new blob
op also needs its table in ``schema/rustconv.fbs`` (then
``scripts/gen_schema.sh``) and its entry in ``rustconv.export.ir.OPS``
(generated class, value fields, anchor, fields read from outside its
kernel, elementwise or view flags). The runtime's side is one file and one
registration too (``delegate/src/step/mod.rs``). A new unary or binary
elementwise op is one row of the table in :mod:`.unary` or :mod:`.binary`.
"""

import importlib
import pkgutil

from rustconv.export.ops_lowering.common import (
    SUPPORTED_DTYPES,
    GraphContext,
    NotSupported,
    aten_op,
)
from rustconv.export.ops_lowering.registry import (
    OpLowering,
    is_anchor,
    lowering_for,
    reason_for,
    register,
    registered,
)

__all__ = [
    "SUPPORTED_DTYPES",
    "GraphContext",
    "NotSupported",
    "OpLowering",
    "aten_op",
    "is_anchor",
    "lowering_for",
    "reason_for",
    "register",
    "registered",
]

#: Every module of this package, in name order: importing each registers its
#: lowerings and evaluators, so a new module file is registered by being here.
MODULES: tuple[str, ...] = tuple(
    importlib.import_module(f"{__name__}.{info.name}").__name__
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
)
