"""The op registry: one :class:`OpLowering` per op kind, found by target.

Like the node visitors of ExecuTorch's XNNPACK backend
(``backends/xnnpack/operators/``) together with its partitioner configs, each
lowering class owns everything about one kind of op: the ATen overloads it
accepts (edge-dialect wrappers are unwrapped to them), the support check the
partitioner runs on the whole program, and the emitter ``preprocess`` runs on
the partition. Keeping the two in one class is what keeps "tagged" and
"lowerable" the same decision.

Registering a class (``@register``) is all it takes for the partitioner,
``explain()`` and ``preprocess`` to know the op.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch.fx import Node

from rustconv.export.ops_lowering.builder import Builder
from rustconv.export.ops_lowering.common import GraphContext, NotSupported, target_key

__all__ = [
    "OpLowering",
    "register",
    "lowering_for",
    "is_anchor",
    "registered",
    "computed_inside_reason",
]


class OpLowering:
    """One op kind: its targets, its support check and its blob emitter.

    Subclasses set :attr:`kind` and :attr:`targets` and implement
    :meth:`check` and :meth:`emit`; the rest has defaults that fit most ops.
    """

    #: Short name of the op kind, used in reasons and logs ("conv1d", "unary").
    kind: ClassVar[str] = ""
    #: ATen overloads (or Python callables such as ``operator.getitem``).
    targets: ClassVar[Iterable[Any]] = ()
    #: Conv1d and LinearScan: a partition needs one, and each starts a kernel.
    is_anchor: ClassVar[bool] = False

    def check(self, node: Node, ctx: GraphContext) -> None:
        """Raises :class:`NotSupported` if RustConv cannot run ``node``."""
        raise NotImplementedError

    def unsupported_reason(self, node: Node, ctx: GraphContext) -> str | None:
        """``None`` if RustConv can run ``node``, else a human-readable reason."""
        try:
            self.check(node, ctx)
        except NotSupported as e:
            return str(e)
        return None

    def inline_only(self, node: Node, ctx: GraphContext) -> bool:
        """True if ``node`` produces nothing the delegate could return.

        Such a node (a pad folded into its convolution, a split whose pieces
        become slices, a SymInt, a scalar constant, a comparison's bool mask)
        is only taken together with all of its users.
        """
        return False

    def check_item(self, node: Node, index: int, ctx: GraphContext) -> None:
        """For an op returning a tuple (``native_layer_norm``): raises
        :class:`NotSupported` unless RustConv gives item ``index`` a value
        (the ``getitem`` reading it then emits nothing)."""
        raise NotSupported(f"{node.name} ({self.kind}) has no items RustConv reads")

    def outside_operands(self, node: Node) -> list[Node]:
        """Operands the runtime prepares at load, which must therefore come
        from outside the delegate (constants or inputs); the rule is
        :func:`computed_inside_reason`."""
        return []

    def export_operands(self, node: Node) -> list[Node]:
        """Operands whose data ``emit`` reads at export (a batch norm's statistics).

        Each must be a constant, or computed from constants in the same
        partition (:mod:`.folding`); never a delegate input.
        """
        return []

    def emit(self, node: Node, builder: Builder) -> None:
        """Adds the blob nodes implementing ``node`` to ``builder``."""
        raise NotImplementedError


def computed_inside_reason(operand: Node, node: Node, computed_inside: bool) -> str | None:
    """The rule for :meth:`OpLowering.outside_operands` (a conv's weight and
    bias), stated once for the partitioner and ``preprocess``: the runtime
    prepares such an operand at load (layout, FFT spectra), so it is a
    constant, a delegate input, or computed from constants at export, never
    computed inside the delegate. Returns why ``operand`` breaks it (when
    ``computed_inside``), else None."""
    if not computed_inside:
        return None
    return (
        f"{operand.name} is computed inside the delegate, but RustConv prepares it at load "
        f"(an operand of {node.name}: a conv weight or bias), so it must be a constant or a "
        "delegate input"
    )


_BY_TARGET: dict[Any, OpLowering] = {}
_ALL: list[OpLowering] = []


def register(cls: type[OpLowering]) -> type[OpLowering]:
    """Class decorator: makes ``cls`` the lowering of each of its targets."""
    instance = cls()
    for target in cls.targets:
        if target in _BY_TARGET:
            raise ValueError(
                f"{target} is registered by both {type(_BY_TARGET[target]).__name__} "
                f"and {cls.__name__}"
            )
        _BY_TARGET[target] = instance
    _ALL.append(instance)
    return cls


def lowering_for(node: Node) -> OpLowering | None:
    """The lowering of a ``call_function`` node, or ``None`` if no kind claims it."""
    if node.op != "call_function":
        return None
    try:
        return _BY_TARGET.get(target_key(node))
    except TypeError:  # an unhashable target
        return None


def is_anchor(node: Node) -> bool:
    """Whether ``node``'s op is a registered anchor (:attr:`OpLowering.is_anchor`):
    a convolution or linear scan, what a delegated partition is built around."""
    lowering = lowering_for(node)
    return lowering is not None and lowering.is_anchor


def registered() -> list[OpLowering]:
    """Every registered lowering, in registration order."""
    return list(_ALL)


def reason_for(node: Node, ctx: GraphContext) -> str | None:
    """``None`` if some lowering accepts ``node``; otherwise why not."""
    if node.op != "call_function":
        return f"{node.op} nodes are not delegated"
    lowering = lowering_for(node)
    if lowering is None:
        return f"{op_name(node)} is not a RustConv op"
    from rustconv.export.ops_lowering.quantized import quantized_reason

    return (
        quantized_reason(node)
        or lowering.unsupported_reason(node, ctx)
        or unbounded_size_reason(node, ctx)
    )


def unbounded_size_reason(node: Node, ctx: GraphContext) -> str | None:
    """Why a tensor ``node`` reads or writes has a size RustConv cannot plan for.

    The runtime plans memory once, for each dynamic dimension's upper bound
    (:mod:`rustconv.export.shapes`). An unbacked size (``u0``: computed from a
    tensor's value, e.g. a padding read with ``.item()``) may have none, and
    nothing the user can set gives it one: refusing the node here leaves it to
    the next partitioner and lets ``explain()`` say why. A ``Dim`` declared
    without ``max`` is not refused here: ``preprocess`` raises
    :class:`~rustconv.errors.DynamicShapeError` telling the user to set one.
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from rustconv.errors import DynamicShapeError
    from rustconv.export.shapes import upper_bound

    ranges = dict(ctx.ep.range_constraints) if ctx.ep is not None else {}
    memo = ctx.cache.setdefault("unbounded_size", {})
    tensors: list[tuple[str, Any]] = [("output", node.meta.get("val"))]
    tensors += [(f"input {arg.name}", arg.meta.get("val")) for arg in node.all_input_nodes]
    for what, val in tensors:
        for tensor in val if isinstance(val, (list, tuple)) else (val,):
            if not isinstance(tensor, torch.Tensor):
                continue
            for axis, size in enumerate(tensor.shape):
                if not isinstance(size, torch.SymInt) or not free_unbacked_symbols(size):
                    continue
                key = str(size.node.expr)
                if key not in memo:
                    try:
                        upper_bound(size, ranges, f"dimension {axis} of its {what}")
                        memo[key] = None
                    except DynamicShapeError:
                        memo[key] = (
                            f"has size {key}, computed from a tensor's value at run time, with "
                            "no finite upper bound; RustConv plans memory for the largest shape"
                        )
                if memo[key] is not None:
                    return f"dimension {axis} of its {what} {memo[key]}"
    return None


def op_name(node: Node) -> str:
    """``aten.mm.default`` for plain and edge ops alike; the target's name otherwise."""
    key = target_key(node)
    if isinstance(key, torch._ops.OpOverload):
        return str(key)
    return getattr(key, "__name__", str(key))


__all__ += ["reason_for", "op_name", "NotSupported"]
