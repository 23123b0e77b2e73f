"""What an op's ``emit`` may use of the lowering: :class:`Builder`.

The op lowerings are written against this protocol, not against
:class:`rustconv.export.lowering.LoweringBuilder` (which implements it and
imports the registry to find them), so the lowerings never import the module
that drives them, not even for annotations. ``tests/export/test_lowering.py``
checks that the builder satisfies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch.fx import Node

from rustconv.export.ir import IRGraph, IRNode
from rustconv.export.ops_lowering.common import GraphContext

__all__ = ["Builder"]


@runtime_checkable
class Builder(Protocol):
    """Reads a node's operands as blob values and adds the blob nodes of its op."""

    #: The exported program's facts (constants, inputs) the checks consult.
    ctx: GraphContext
    #: The blob graph being built.
    graph: IRGraph

    def constant_data(self, index: int) -> torch.Tensor | None:
        """The data of Constant value ``index``, else None."""
        ...

    def new_constant(self, name: str, tensor: torch.Tensor) -> int:
        """A new Constant value holding ``tensor``."""
        ...

    def value(self, arg: Any, consumer: Node, role: str) -> int:
        """The blob value of operand ``arg`` (``role`` names it in errors)."""
        ...

    def operand(self, arg: Any, consumer: Node, role: str) -> tuple[int, float]:
        """A value id, or -1 and the scalar beside it."""
        ...

    def new_output(
        self, node: Node, dtype: torch.dtype | None = None, is_mask: bool = False
    ) -> int:
        """A fresh intermediate value for ``node``'s result."""
        ...

    def derived_value(self, source: int, name: str) -> int:
        """A fresh intermediate value shaped like ``source``."""
        ...

    def new_intermediate(
        self, name: str, dtype: torch.dtype, shape: Sequence[int | torch.SymInt]
    ) -> int:
        """A fresh intermediate value of ``shape`` (sizes as in ``meta['val']``:
        a dynamic one a ``SymInt``), for a helper node whose result has no
        node's shape."""
        ...

    def value_like(self, node: Node, name: str, *, is_mask: bool = False) -> int:
        """A fresh intermediate value shaped like ``node``'s result, not bound to it."""
        ...

    def alias(self, node: Node, index: int, *, reshape: bool = False) -> None:
        """``node``'s result is the existing value ``index``."""
        ...

    def mark_inline(self, node: Node, what: str) -> None:
        """``node`` emits nothing; ``what`` says why."""
        ...

    def value_of(self, node: Node) -> int | None:
        """The value bound to ``node``'s result, if any yet."""
        ...

    def producer(self, index: int) -> IRNode | None:
        """The blob node writing value ``index``, if one was added."""
        ...

    def add(self, node: Node, op_type: int, op: Any) -> IRNode:
        """Appends a blob node implementing (part of) ``node``."""
        ...

    def join_handles(self, ir: IRNode, node: Node) -> None:
        """``node`` was folded into ``ir``: profiling attributes it there."""
        ...

    def identity(self, node: Node, source: int) -> int:
        """Emits a copy of ``source`` as ``node``'s result."""
        ...
