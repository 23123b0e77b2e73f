"""Which nodes RustConv can run, and how to read their arguments.

This module is shared by the partitioner (which decides what to tag), by
``ops_to_not_decompose`` (which must make exactly the same decision on the
ATen graph, or ExecuTorch's post-lowering check fails), and by the backend's
``preprocess`` (which reads the same arguments to build the blob). Keeping the
decision in one place is what keeps those three consistent.

A convolution reaches the partitioner in one of three forms, depending on the
lowering flow (``to_edge`` decomposes ``aten.conv1d`` to ``aten.convolution``;
``to_edge_transform_and_lower`` with this partitioner keeps ``aten.conv1d``):

* ``aten.convolution.default``  - explicit symmetric padding, ``transposed`` flag
* ``aten.conv1d.default``       - explicit symmetric padding
* ``aten.conv1d.padding``       - ``padding="same"`` / ``"valid"``

Each may be a plain ``torch._ops.OpOverload`` or ExecuTorch's edge-dialect
wrapper around one; :func:`aten_op` unwraps the latter.

PyTorch decomposes ``padding="same"`` with an even total padding into
``aten.constant_pad_nd`` (the extra element on the right) followed by a
symmetric convolution. Such a zero pad of the last dimension feeding only a
supported convolution is taken too and folded into ``pad_left``/``pad_right``;
this also captures causal convolutions written as ``F.pad(x, (k - 1, 0))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

import rustconv.ops  # noqa: F401  (registers torch.ops.rustconv.linear_scan)

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
    "conv_params",
    "pad_amounts",
    "conv_unsupported_reason",
    "pad_unsupported_reason",
    "scan_unsupported_reason",
    "unsupported_reason",
    "scan_operands",
]

#: Dtypes the runtime implements. Every tensor of a delegated node must have one
#: of these, and all tensors of one node the same. float16 tensors stay float16
#: in memory; the runtime computes in float32.
SUPPORTED_DTYPES: frozenset = frozenset({torch.float32, torch.float16})

_aten = torch.ops.aten
CONV_OPS = frozenset({_aten.convolution.default, _aten.conv1d.default, _aten.conv1d.padding})
PAD_OPS = frozenset({_aten.constant_pad_nd.default})
SCAN_OPS = frozenset({torch.ops.rustconv.linear_scan.default})


def aten_op(node: Node) -> torch._ops.OpOverload | None:
    """The ``OpOverload`` a ``call_function`` node calls, unwrapping edge ops."""
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target
    # executorch.exir.dialects.edge._ops.EdgeOpOverload (not an OpOverload
    # subclass) keeps the ATen or custom overload it wraps in ``_op``.
    inner = getattr(target, "_op", None)
    return inner if isinstance(inner, torch._ops.OpOverload) else None


def is_conv(node: Node) -> bool:
    return aten_op(node) in CONV_OPS


def is_pad(node: Node) -> bool:
    return aten_op(node) in PAD_OPS


def is_scan(node: Node) -> bool:
    return aten_op(node) in SCAN_OPS


def _bound_args(node: Node) -> dict[str, Any]:
    """Arguments by schema name, with schema defaults filled in."""
    op = aten_op(node)
    assert op is not None
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            raise ValueError(f"{node.format_node()}: missing argument {arg.name!r}")
    return bound


class _NotSupported(Exception):
    """Internal: carries the reason a node cannot be delegated."""


def _single_int(value: Any, what: str) -> int:
    """A concrete int from a 1-element list (conv1d/convolution) or a bare int."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise _NotSupported(f"{what} has {len(value)} entries, expected 1 (1-D)")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _NotSupported(f"{what} is {value!r}, not a constant int")
    return value


def _val(node: Any, what: str) -> torch.Tensor:
    if not isinstance(node, Node):
        raise _NotSupported(f"{what} is {node!r}, not a tensor produced in the graph")
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise _NotSupported(f"{what} ({node.name}) has no tensor metadata")
    return val


def _is_static(shape: Sequence[int | torch.SymInt]) -> bool:
    return all(isinstance(d, int) for d in shape)


@dataclass(frozen=True)
class ConvParams:
    """A 1-D convolution's operands and attributes, independent of its ATen form.

    ``pad_left``/``pad_right`` are the convolution's own padding; a fused
    ``constant_pad_nd`` is added by the backend, not here.
    """

    input: Node
    weight: Node
    bias: Node | None
    stride: int
    pad_left: int
    pad_right: int
    dilation: int
    groups: int


def conv_params(node: Node) -> ConvParams:
    """Reads a conv node in any of its three forms (see the module docstring).

    Raises ``ValueError`` if the node is not a convolution this backend
    understands; use :func:`conv_unsupported_reason` for a yes/no answer.
    """
    try:
        return _conv_params(node)
    except _NotSupported as e:
        raise ValueError(f"{node.name}: {e}") from None


def _conv_params(node: Node) -> ConvParams:
    op = aten_op(node)
    if op not in CONV_OPS:
        raise _NotSupported(f"{op} is not a convolution")
    args = _bound_args(node)
    if op is _aten.convolution.default and args["transposed"]:
        raise _NotSupported("transposed convolution is not supported")
    weight_val = _val(args["weight"], "weight")
    stride = _single_int(args["stride"], "stride")
    dilation = _single_int(args["dilation"], "dilation")
    groups = args["groups"]
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise _NotSupported(f"groups is {groups!r}, not a constant int")
    if stride < 1 or dilation < 1 or groups < 1:
        raise _NotSupported(
            f"stride {stride}, dilation {dilation} and groups {groups} must be >= 1"
        )

    padding = args["padding"]
    if isinstance(padding, str):
        if padding == "valid":
            pad_left = pad_right = 0
        elif padding == "same":
            if weight_val.dim() != 3 or not _is_static(weight_val.shape):
                raise _NotSupported("padding='same' needs a static 3-D weight")
            # PyTorch's split (aten/src/ATen/native/Convolution.cpp,
            # _convolution_mode): the odd element goes to the right.
            total = dilation * (weight_val.shape[2] - 1)
            pad_left = total // 2
            pad_right = total - pad_left
        else:
            raise _NotSupported(f"padding mode {padding!r} is not supported")
    else:
        pad_left = pad_right = _single_int(padding, "padding")
        if pad_left < 0:
            raise _NotSupported(f"negative padding {pad_left}")

    bias = args["bias"]
    if bias is not None and not isinstance(bias, Node):
        raise _NotSupported(f"bias is {bias!r}, not a tensor")
    return ConvParams(
        input=args["input"],
        weight=args["weight"],
        bias=bias,
        stride=stride,
        pad_left=pad_left,
        pad_right=pad_right,
        dilation=dilation,
        groups=groups,
    )


def _check_dtypes(named_vals: Sequence[tuple[str, torch.Tensor]]) -> None:
    dtypes = {val.dtype for _, val in named_vals}
    for name, val in named_vals:
        if val.dtype not in SUPPORTED_DTYPES:
            raise _NotSupported(
                f"{name} dtype {val.dtype} is not supported "
                f"(supported: {', '.join(sorted(str(d) for d in SUPPORTED_DTYPES))})"
            )
    if len(dtypes) > 1:
        raise _NotSupported(
            "mixed dtypes " + ", ".join(f"{name}={val.dtype}" for name, val in named_vals)
        )


def _check_operand_source(node: Node, what: str) -> None:
    """Weights and biases must come from outside the delegate.

    A constant (parameter, buffer, lifted tensor) is copied into the blob; any
    other tensor computed outside the delegate arrives as a delegate input. A
    weight computed by an op this backend would itself take (a conv output used
    as a weight) is refused, because the runtime prepares weights at init.
    """
    if is_conv(node) or is_scan(node) or is_pad(node):
        raise _NotSupported(
            f"{what} is produced by {node.name}, an op RustConv would delegate; "
            "weights must be constants or come from outside the delegate"
        )


def conv_unsupported_reason(node: Node) -> str | None:
    """``None`` if RustConv can run this convolution, else a human-readable reason."""
    try:
        p = _conv_params(node)
        x = _val(p.input, "input")
        w = _val(p.weight, "weight")
        y = _val(node, "output")
        if x.dim() != 3 or w.dim() != 3 or y.dim() != 3:
            raise _NotSupported(f"not a 1-D convolution (input {x.dim()}-D, weight {w.dim()}-D)")
        named = [("input", x), ("weight", w), ("output", y)]
        if p.bias is not None:
            b = _val(p.bias, "bias")
            if b.dim() != 1:
                raise _NotSupported(f"bias is {b.dim()}-D, expected 1-D")
            named.append(("bias", b))
        _check_dtypes(named)
        if not _is_static(w.shape):
            raise _NotSupported(f"weight shape {tuple(w.shape)} is not static")
        if not isinstance(x.shape[1], int):
            raise _NotSupported("input channel count is not static")
        if x.shape[1] != w.shape[1] * p.groups or w.shape[0] % p.groups != 0:
            raise _NotSupported(
                f"channels do not match groups={p.groups}: input {tuple(x.shape)}, "
                f"weight {tuple(w.shape)}"
            )
        _check_operand_source(p.weight, "weight")
        if p.bias is not None:
            _check_operand_source(p.bias, "bias")
    except _NotSupported as e:
        return str(e)
    return None


def pad_amounts(node: Node) -> tuple[int, int]:
    """(left, right) of a ``constant_pad_nd`` that only pads the last dimension.

    Raises ``ValueError`` for any other pad; see :func:`pad_unsupported_reason`.
    """
    try:
        return _pad_amounts(node)
    except _NotSupported as e:
        raise ValueError(f"{node.name}: {e}") from None


def _pad_amounts(node: Node) -> tuple[int, int]:
    args = _bound_args(node)
    pad = args["pad"]
    if not isinstance(pad, (list, tuple)) or len(pad) != 2:
        raise _NotSupported(f"pads {pad!r}, not just the last dimension")
    left, right = pad
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in (left, right)):
        raise _NotSupported(f"pad amounts {pad!r} are not constant ints")
    if left < 0 or right < 0:
        raise _NotSupported(f"negative pad {pad!r} (cropping) cannot be fused")
    if args["value"] != 0:
        raise _NotSupported(f"pad value {args['value']!r} is not zero")
    return left, right


def pad_unsupported_reason(node: Node) -> str | None:
    """``None`` if this pad can be folded into the single conv that consumes it."""
    try:
        if not is_pad(node):
            raise _NotSupported("not a constant_pad_nd")
        _pad_amounts(node)
        x = _val(node.args[0], "input")
        if x.dim() != 3:
            raise _NotSupported(f"pads a {x.dim()}-D tensor, expected 3-D")
        users = list(node.users)
        if len(users) != 1:
            raise _NotSupported(f"has {len(users)} users; only a single conv user fuses")
        (user,) = users
        if not is_conv(user) or conv_unsupported_reason(user) is not None:
            raise _NotSupported(f"its user {user.name} is not a supported convolution")
        if _conv_params(user).input is not node:
            raise _NotSupported(f"it is not the input of {user.name}")
    except _NotSupported as e:
        return str(e)
    return None


def scan_unsupported_reason(node: Node) -> str | None:
    """``None`` if RustConv can run this ``rustconv.linear_scan``."""
    try:
        if not is_scan(node):
            raise _NotSupported("not rustconv.linear_scan")
        args = _bound_args(node)
        named = [
            ("x0", _val(args["x0"], "x0")),
            ("a", _val(args["a"], "a")),
            ("u", _val(args["u"], "u")),
            ("output", _val(node, "output")),
        ]
        ranks = [val.dim() for _, val in named]
        if ranks != [2, 3, 3, 3]:
            raise _NotSupported(f"ranks {ranks}, expected [2, 3, 3, 3]")
        _check_dtypes(named)
    except _NotSupported as e:
        return str(e)
    return None


def unsupported_reason(node: Node) -> str | None:
    """``None`` if the partitioner may tag ``node``; otherwise why not."""
    if node.op != "call_function":
        return f"{node.op} nodes are not delegated"
    if is_conv(node):
        return conv_unsupported_reason(node)
    if is_scan(node):
        return scan_unsupported_reason(node)
    if is_pad(node):
        return pad_unsupported_reason(node)
    return f"{node.target} is not a RustConv op"


def scan_operands(node: Node) -> tuple[Node, Node, Node]:
    """(x0, a, u) of a ``rustconv.linear_scan`` node."""
    args = _bound_args(node)
    return args["x0"], args["a"], args["u"]
