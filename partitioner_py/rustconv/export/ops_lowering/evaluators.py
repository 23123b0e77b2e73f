"""What each blob op kind computes, in torch: one evaluator per ``Op`` union tag.

An op's evaluator is written in the module of its lowering (``@evaluates``),
beside the emitter that fills the same schema table, so that the meaning of
the table's fields (explicit padding, scalar operands at index -1, Python-style
slice bounds...) is stated where they are written. The blob interpreter
(:mod:`rustconv.devtools.reference`) walks a blob and asks each node's
evaluator through :class:`BlobEnv`, which it implements; nothing on an export
or inference path calls one. Keeping the protocol here, not the interpreter,
is what lets the export package state these meanings without importing the
developer tools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

__all__ = ["BlobEnv", "Evaluator", "evaluates", "evaluator_for", "evaluated_ops"]


class BlobEnv(Protocol):
    """The values computed so far, as an evaluator reads them."""

    def read(self, index: int) -> torch.Tensor:
        """Value ``index`` in float32 (every node computes in float32)."""
        ...

    def operand(self, index: int, scalar: float) -> torch.Tensor:
        """A value, or the scalar beside it where the index is -1."""
        ...

    def shape(self, index: int) -> torch.Size:
        """Value ``index``'s shape in this run."""
        ...

    def dims(self, index: int) -> list[Any]:
        """Value ``index``'s declared dimensions (the schema's ``Dim`` structs)."""
        ...


#: An op's evaluator: its table's object (fields as the blob stores them,
#: value fields as indices) -> its output, in float32.
Evaluator = Callable[[Any, BlobEnv], torch.Tensor]

_BY_OP: dict[int, Evaluator] = {}


def evaluates(op_type: int) -> Callable[[Evaluator], Evaluator]:
    """Decorator: makes the function the evaluator of blob op ``op_type``."""

    def register(fn: Evaluator) -> Evaluator:
        if op_type in _BY_OP:
            raise ValueError(
                f"op type {op_type} is evaluated by both {_BY_OP[op_type].__qualname__} "
                f"and {fn.__qualname__}"
            )
        _BY_OP[op_type] = fn
        return fn

    return register


def evaluator_for(op_type: int) -> Evaluator | None:
    """The evaluator of ``op_type``, once the package has been imported."""
    return _BY_OP.get(op_type)


def evaluated_ops() -> dict[int, Evaluator]:
    """Every registered evaluator, by op type."""
    return dict(_BY_OP)
