"""Helpers every op lowering shares: reading arguments, metadata and dtypes.

Support checks raise :class:`NotSupported` with a sentence a user can act on;
:meth:`rustconv.export.ops_lowering.registry.OpLowering.unsupported_reason` turns it
into the ``str | None`` the partitioner and ``explain()`` report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.fx import Node

__all__ = [
    "SUPPORTED_DTYPES",
    "MAX_RANK",
    "NotSupported",
    "GraphContext",
    "aten_op",
    "target_key",
    "bound_args",
    "tensor_val",
    "is_float_tensor",
    "is_bool_tensor",
    "check_dtypes",
    "check_rank",
    "dim_expr",
    "shape_exprs",
    "same_expr",
    "static_int",
    "single_int",
    "normalize_dim",
]

#: Dtypes the runtime implements. Every tensor of a delegated node must have one
#: of these, and all tensors of one node the same. float16 tensors stay float16
#: in memory; the runtime computes in float32.
SUPPORTED_DTYPES: frozenset = frozenset({torch.float32, torch.float16})

#: Highest rank of an elementwise or view operand (the runtime's stride loops).
MAX_RANK = 4


class NotSupported(Exception):
    """Carries the reason a node cannot be delegated (internal to support checks)."""


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


def target_key(node: Node) -> Any:
    """What the registry is keyed on: the unwrapped overload, or the raw target
    for Python callables (``operator.getitem``, SymInt arithmetic)."""
    op = aten_op(node)
    return op if op is not None else node.target


class GraphContext:
    """What a support check may ask about the program around a node.

    Whether a placeholder is a constant (parameter, buffer, lifted tensor) is
    a property of the ``ExportedProgram``'s signature, not of the node, and the
    answer differs between the whole program (at partitioning) and a partition
    (in ``preprocess``). A mutated buffer is never a constant: the delegate
    does not own mutable state, so it stays a regular delegate input.
    """

    def __init__(self, ep: ExportedProgram | None) -> None:
        self.ep = ep
        #: Memoised per-node answers that depend on the whole graph (see
        #: :mod:`.folding`); valid as long as the graph is not edited.
        self.cache: dict[str, dict] = {}
        if ep is None:
            self._constants: dict[str, str] = {}
            self._mutated: set[str] = set()
            return
        sig = ep.graph_signature
        mutated_targets = set(sig.buffers_to_mutate.values())
        self._mutated = {
            name for name, target in sig.inputs_to_buffers.items() if target in mutated_targets
        }
        self._constants = {name: "parameter" for name in sig.inputs_to_parameters}
        self._constants.update(
            {name: "buffer" for name in sig.inputs_to_buffers if name not in self._mutated}
        )
        self._constants.update({name: "constant" for name in sig.inputs_to_lifted_tensor_constants})

    def is_constant(self, node: Any) -> bool:
        """A placeholder whose data the program holds (and the delegate may own)."""
        return isinstance(node, Node) and node.op == "placeholder" and node.name in self._constants

    def is_mutable_buffer(self, node: Any) -> bool:
        return isinstance(node, Node) and node.op == "placeholder" and node.name in self._mutated

    def constant_tensor(self, node: Node) -> torch.Tensor | None:
        """The data behind a constant placeholder, else ``None``."""
        if self.ep is None or not self.is_constant(node):
            return None
        from torch._export.utils import (
            get_buffer,
            get_lifted_tensor_constant,
            get_param,
        )

        kind = self._constants[node.name]
        if kind == "parameter":
            return get_param(self.ep, node)
        if kind == "buffer":
            return get_buffer(self.ep, node)
        return get_lifted_tensor_constant(self.ep, node)


def bound_args(node: Node) -> dict[str, Any]:
    """Arguments by schema name, with schema defaults filled in."""
    op = aten_op(node)
    if op is None:
        raise NotSupported(f"{node.target} has no ATen schema")
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            raise NotSupported(f"missing argument {arg.name!r}")
    return bound


def tensor_val(node: Any, what: str) -> torch.Tensor:
    """``node.meta['val']`` of a tensor-valued node, or :class:`NotSupported`."""
    if not isinstance(node, Node):
        raise NotSupported(f"{what} is {node!r}, not a tensor produced in the graph")
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise NotSupported(f"{what} ({node.name}) has no tensor metadata")
    return val


def is_float_tensor(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def is_bool_tensor(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


def check_dtypes(named_vals: Sequence[tuple[str, torch.Tensor]]) -> torch.dtype:
    """All tensors supported and of one dtype; returns that dtype."""
    for name, val in named_vals:
        if val.dtype not in SUPPORTED_DTYPES:
            raise NotSupported(
                f"{name} dtype {val.dtype} is not supported "
                f"(supported: {', '.join(sorted(str(d) for d in SUPPORTED_DTYPES))})"
            )
    dtypes = {val.dtype for _, val in named_vals}
    if len(dtypes) > 1:
        raise NotSupported(
            "mixed dtypes " + ", ".join(f"{name}={val.dtype}" for name, val in named_vals)
        )
    (dtype,) = dtypes
    return dtype


def check_rank(named_vals: Iterable[tuple[str, torch.Tensor]], limit: int = MAX_RANK) -> None:
    for name, val in named_vals:
        if val.dim() > limit:
            raise NotSupported(f"{name} is {val.dim()}-D; RustConv handles up to {limit}-D")


def dim_expr(size: int | torch.SymInt) -> sympy.Expr:
    """A dimension as a sympy expression (static sizes as integers)."""
    if isinstance(size, torch.SymInt):
        return sympy.sympify(size.node.expr)
    return sympy.Integer(int(size))


def shape_exprs(val: torch.Tensor) -> tuple[sympy.Expr, ...]:
    return tuple(dim_expr(d) for d in val.shape)


def same_expr(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether two sizes are provably equal for every value of their symbols."""
    if a == b:
        return True
    return sympy.simplify(a - b) == 0


def static_int(value: Any, what: str) -> int:
    """A concrete int (not a bool, not symbolic), or :class:`NotSupported`."""
    if isinstance(value, torch.SymInt):
        maybe = value.node.maybe_as_int()
        if maybe is not None:
            return int(maybe)
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotSupported(f"{what} is {value!r}, not a constant int")
    return value


def single_int(value: Any, what: str) -> int:
    """A concrete int from a 1-element list (a 1-D conv's stride, padding,
    dilation) or a bare int, or :class:`NotSupported`."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise NotSupported(f"{what} has {len(value)} entries, expected 1 (1-D)")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotSupported(f"{what} is {value!r}, not a constant int")
    return value


def normalize_dim(dim: Any, rank: int, what: str = "dim") -> int:
    d = static_int(dim, what)
    if not -max(rank, 1) <= d < max(rank, 1):
        raise NotSupported(f"{what} {d} is out of range for a {rank}-D tensor")
    return d % max(rank, 1)
