"""Tensors a model computes from its constants: evaluated at export into one Constant.

Models often compute a convolution's weight or bias from their parameters on
every call: transformers' ``Lfm2ShortConv`` passes
``self.conv.weight.squeeze(1).unsqueeze(1)``; weight normalization
(``torch.nn.utils.parametrizations.weight_norm`` and the older hook) computes
``g * v / ||v||`` (``pow``, ``sum``, ``div``, ``mul`` once decomposed); others
``permute``, ``flip`` or cast a weight. The runtime prepares a constant weight
once, at load, in the layout its kernels read; a weight that arrives as a
delegate input has to be read as it comes on every call. So such a chain is
evaluated here, at export, and the blob holds its result as one ``Constant``
value, as ExecuTorch's own constant propagation would.

A node *computes a constant* (:func:`computes_constant`) when

* it calls a functional, deterministic ATen or edge op: no mutation, no random
  numbers, not a quantize/dequantize op (a quantized weight stays with the
  backend that runs the quantized op, see :mod:`.quantized`), not an anchor
  (a convolution or scan, :attr:`OpLowering.is_anchor`: those anchor partitions);
* every tensor it reads is a constant (parameter, buffer, lifted constant) or
  computes a constant itself, and it reads at least one;
* its result is one tensor (or a split's pieces, each then read through its
  ``getitem``) of static shape with no more elements than the largest tensor
  it reads (an ``expand`` of a bias to the activation's shape
  would put a large tensor in the blob for nothing), and, unless all of its
  users compute constants too, of a dtype the blob holds.

The partitioner takes such a node only together with every user and every
constant-computing input (:mod:`rustconv.export.partition_proposal`): its result
never leaves the delegate, and is a delegate-owned constant only if all of its
sources are. Where that fails (the chain is shared with a node outside), the
node stays outside, runs where the rest of the program runs, and its result is
an ordinary delegate input, which the runtime reads on every call: correct,
only not prepared ahead. Duplicating a shared chain inside the partition would
avoid that, but a partitioner may not add nodes (ExecuTorch checks that the
graph it returns is unchanged).

``preprocess`` (:class:`rustconv.export.lowering.LoweringBuilder`) calls the node's op
on the real tensors (edge ops are callable) and keeps the result; it becomes a
``Constant`` value the first time a blob node reads it.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
from torch.fx import Node
from torch.utils import _pytree as pytree

from rustconv.export.ops_lowering.common import SUPPORTED_DTYPES, NotSupported, aten_op
from rustconv.export.ops_lowering.quantized import QUANT_NAMESPACES
from rustconv.export.ops_lowering.registry import is_anchor

if TYPE_CHECKING:
    from rustconv.export.ops_lowering.common import GraphContext

__all__ = ["computes_constant", "constant_reason", "evaluate"]


def _node_inputs(node: Node) -> list[Node]:
    return [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, Node)]


def _results(val: Any) -> list[torch.Tensor] | None:
    """A node's result as a list of tensors (one, or a split's pieces), else None."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)) and val and all(isinstance(v, torch.Tensor) for v in val):
        return list(val)
    return None


def _is_static(val: torch.Tensor) -> bool:
    return all(isinstance(d, int) for d in val.shape)


def _op_reason(node: Node) -> str | None:
    """Why ``node``'s op cannot be evaluated at export, or None."""
    op = aten_op(node)
    if op is None:
        if node.target is operator.getitem:
            return None  # a piece of a split evaluated at export
        return f"{node.target} is not an ATen or edge op"
    if is_anchor(node):
        return f"{op} is an anchor (a convolution or scan): delegated, not evaluated at export"
    if op.namespace in QUANT_NAMESPACES:
        return "a quantize/dequantize op stays with the backend running the quantized op"
    if op._schema.is_mutable:
        return f"{op} mutates its input"
    if torch.Tag.nondeterministic_seeded in op.tags:
        return f"{op} draws random numbers"
    return None


def _valued_reason(node: Node, ctx: GraphContext) -> str | None:
    """Why ``node``'s result is not a function of constants alone (memoised per context)."""
    cache = ctx.cache.setdefault("constant_valued", {})
    if node not in cache:
        cache[node] = _compute_valued_reason(node, ctx)
    return cache[node]


def _compute_valued_reason(node: Node, ctx: GraphContext) -> str | None:
    if node.op != "call_function":
        return f"{node.op} nodes are not evaluated"
    reason = _op_reason(node)
    if reason is not None:
        return reason
    inputs = _node_inputs(node)
    if not inputs:
        return "it reads no tensor"
    largest = 0
    for source in inputs:
        if not ctx.is_constant(source) and _valued_reason(source, ctx) is not None:
            return f"it reads {source.name}, which is not a constant"
        for val in _results(source.meta.get("val")) or []:
            largest = max(largest, int(val.numel()))
    results = _results(node.meta.get("val"))
    if results is None or not all(_is_static(r) for r in results):
        return "its result is not a tensor (or a split's tensors) of static shape"
    numel = sum(int(r.numel()) for r in results)
    if numel > max(largest, 1):
        return (
            f"its result ({numel} elements) is larger than what it reads "
            f"({largest}); RustConv keeps it a computation rather than a large constant"
        )
    return None


def constant_reason(node: Node, ctx: GraphContext) -> str | None:
    """``None`` if ``node`` computes a constant (see the module docstring), else why not."""
    reason = _valued_reason(node, ctx)
    if reason is not None:
        return reason
    val = node.meta["val"]
    readable = isinstance(val, torch.Tensor) and val.dtype in SUPPORTED_DTYPES
    if not readable and any(_valued_reason(user, ctx) is not None for user in node.users):
        what = val.dtype if isinstance(val, torch.Tensor) else "a list of tensors"
        return f"its result is {what}, which RustConv cannot hold"
    return None


def computes_constant(node: Any, ctx: GraphContext) -> bool:
    return isinstance(node, Node) and constant_reason(node, ctx) is None


def evaluate(node: Node, value_of) -> torch.Tensor | list[torch.Tensor]:
    """Runs ``node``'s op on real tensors; ``value_of(source)`` gives each input's."""

    def real(arg: Any) -> Any:
        return value_of(arg) if isinstance(arg, Node) else arg

    args, kwargs = pytree.tree_map(real, (node.args, node.kwargs))
    with torch.no_grad():
        result = node.target(*args, **kwargs)
    expected, got = _results(node.meta["val"]), _results(result)
    if got is None or expected is None or len(got) != len(expected):
        raise NotSupported(f"{node.name} returned {type(result).__name__} at export")
    for r, v in zip(got, expected, strict=True):
        if r.dtype != v.dtype or tuple(r.shape) != tuple(v.shape):
            raise NotSupported(
                f"{node.name} computed {r.dtype}{list(r.shape)} at export, but the "
                f"graph expects {v.dtype}{list(v.shape)}"
            )
    if isinstance(result, torch.Tensor):
        return result.detach().contiguous()
    return [r.detach().contiguous() for r in got]
