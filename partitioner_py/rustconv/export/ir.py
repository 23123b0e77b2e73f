"""The blob graph before it is written: values and nodes with editable links.

``preprocess`` first lowers a partition to this form (:mod:`rustconv.export.lowering`),
then groups it into fused kernels (:mod:`rustconv.export.fusion`), which may reorder
nodes and duplicate some of them, and only then writes the flatbuffer
(:mod:`rustconv.export.graph_writer`), numbering values and nodes. Keeping the
numbering out of the first two steps is what lets fusion copy a node with its
own private output.

An :class:`IRNode` holds the generated flatbuffer object (``Conv1dT``,
``BinaryT``, ...) of its op; the fields naming values (:data:`VALUE_FIELDS`)
hold :class:`IRValue` ids until the writer replaces them with indices.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from rustconv.fb.Binary import BinaryT
from rustconv.fb.Cat import CatT
from rustconv.fb.Clamp import ClampT
from rustconv.fb.Conv1d import Conv1dT
from rustconv.fb.Full import FullT
from rustconv.fb.LinearScan import LinearScanT
from rustconv.fb.Op import Op
from rustconv.fb.Permute import PermuteT
from rustconv.fb.Reduce import ReduceT
from rustconv.fb.Reshape import ReshapeT
from rustconv.fb.Slice import SliceT
from rustconv.fb.Unary import UnaryT
from rustconv.fb.Where import WhereT

__all__ = [
    "OpSpec",
    "OPS",
    "VALUE_FIELDS",
    "OP_TABLES",
    "ANCHOR_OPS",
    "ELEMENTWISE_OPS",
    "EPILOGUE_VIEW_OPS",
    "IRValue",
    "IRNode",
    "IRGraph",
    "regroups",
]


@dataclass(frozen=True)
class OpSpec:
    """What the IR knows of one blob op kind (one schema table)."""

    #: The generated object class of its table.
    table: type
    #: The fields that name values. An ``int`` field may be -1 (absent: no
    #: bias, or the scalar beside it); ``Cat.inputs`` is a list.
    value_fields: tuple[str, ...]
    #: An op a fused kernel is built around (a conv, a scan): each starts one.
    anchor: bool = False
    #: Of ``value_fields``, those the runtime prepares at load, read whole by
    #: every row: stored from outside the op's kernel, never computed in it.
    outside_fields: tuple[str, ...] = ()
    #: Computed element by element (broadcasting its operands): fusion may
    #: place it in an anchor's epilogue or an elementwise pass.
    elementwise: bool = False
    #: A view (moves no element's value) that fusion may carry into an
    #: epilogue after the anchor's result, so the kernel stores through it.
    epilogue_view: bool = False


#: Every blob op kind, by its ``Op`` union tag: the one place the IR learns a
#: new one.
OPS: dict[int, OpSpec] = {
    Op.Conv1d: OpSpec(
        Conv1dT, ("input", "weight", "bias"), anchor=True, outside_fields=("weight", "bias")
    ),
    Op.LinearScan: OpSpec(LinearScanT, ("x0", "a", "u"), anchor=True),
    Op.Unary: OpSpec(UnaryT, ("input",), elementwise=True),
    Op.Binary: OpSpec(BinaryT, ("a", "b"), elementwise=True),
    Op.Where: OpSpec(WhereT, ("cond", "a", "b"), elementwise=True),
    Op.Clamp: OpSpec(ClampT, ("input",), elementwise=True),
    Op.Full: OpSpec(FullT, ("like",)),
    Op.Permute: OpSpec(PermuteT, ("input",), epilogue_view=True),
    Op.Slice: OpSpec(SliceT, ("input",)),
    Op.Reshape: OpSpec(ReshapeT, ("input",), epilogue_view=True),
    Op.Cat: OpSpec(CatT, ("inputs",)),
    Op.Reduce: OpSpec(ReduceT, ("input",)),
}

#: Views of :data:`OPS`.
VALUE_FIELDS: dict[int, tuple[str, ...]] = {op: spec.value_fields for op, spec in OPS.items()}
OP_TABLES: dict[int, type] = {op: spec.table for op, spec in OPS.items()}
ANCHOR_OPS = frozenset(op for op, spec in OPS.items() if spec.anchor)
ELEMENTWISE_OPS = frozenset(op for op, spec in OPS.items() if spec.elementwise)
EPILOGUE_VIEW_OPS = frozenset(op for op, spec in OPS.items() if spec.epilogue_view)


def regroups(source: list[Any], target: list[Any]) -> bool:
    """Whether a ``Reshape`` from dims ``source`` to ``target`` splits or merges
    dimensions: its dimensions other than a static 1 do not pair up in order,
    equal in size and in being dynamic (the runtime's ``reshape_map``). Such a
    reshape is no view: the runtime copies its stored input, alone in its
    kernel (schema/README.md, "Fused kernels")."""

    def kept(dims: list[Any]) -> list[tuple[int, bool]]:
        return [(int(d.size), bool(d.dynamic)) for d in dims if d.dynamic or d.size != 1]

    return kept(source) != kept(target)


@dataclass
class IRValue:
    """A tensor of the blob graph.

    ``shape`` keeps each size as a sympy expression (fusion compares them);
    ``dims`` are the schema's ``Dim`` structs (static size or upper bound).
    ``is_mask`` marks a comparison result: a bool tensor in torch, 1.0/0.0 in
    the blob, which must never leave the kernel that computes it.
    """

    name: str
    dtype: torch.dtype
    shape: tuple[sympy.Expr, ...]
    dims: list[Any]
    kind: int
    io_index: int = 0
    data: bytes | None = None
    is_mask: bool = False
    #: For a ``State`` value: the value id whose contents become the state
    #: after each call (the buffer's ``copy_``); -1 otherwise.
    state_update: int = -1


@dataclass
class IRNode:
    """One blob node: an op object whose value fields hold :class:`IRValue` ids."""

    op_type: int
    op: Any
    name: str
    debug_handles: list[int] = field(default_factory=list)
    kernel: int = -1

    @property
    def output(self) -> int:
        return int(self.op.output)

    @property
    def is_anchor(self) -> bool:
        return OPS[self.op_type].anchor

    @property
    def outside_fields(self) -> tuple[str, ...]:
        """Its operand fields stored from outside its kernel (:attr:`OpSpec.outside_fields`)."""
        return OPS[self.op_type].outside_fields

    def operand_fields(self) -> Iterator[tuple[str, int]]:
        """(field, value id) for every value this node reads, in field order."""
        for name in VALUE_FIELDS[self.op_type]:
            ref = getattr(self.op, name)
            if isinstance(ref, list):
                for item in ref:
                    yield name, int(item)
            elif ref is not None and ref >= 0:
                yield name, int(ref)

    def operands(self) -> list[int]:
        return [ref for _, ref in self.operand_fields()]

    def regroups(self, values: list[IRValue]) -> bool:
        """A ``Reshape`` that splits or merges dimensions (:func:`regroups`)."""
        return self.op_type == Op.Reshape and regroups(
            values[int(self.op.input)].dims, values[self.output].dims
        )

    def remapped(self, mapping: dict[int, int], output: int | None = None) -> IRNode:
        """A copy reading ``mapping[v]`` instead of ``v`` (others unchanged)."""
        op = copy.copy(self.op)
        for name in VALUE_FIELDS[self.op_type]:
            ref = getattr(op, name)
            if isinstance(ref, list):
                setattr(op, name, [mapping.get(int(r), int(r)) for r in ref])
            elif ref is not None and ref >= 0:
                setattr(op, name, mapping.get(int(ref), int(ref)))
        if output is not None:
            op.output = output
        return IRNode(self.op_type, op, self.name, list(self.debug_handles), self.kernel)


@dataclass
class IRGraph:
    """Values, nodes in a topological order, and the call's inputs and outputs."""

    values: list[IRValue]
    nodes: list[IRNode]
    inputs: list[int]
    outputs: list[int]

    def add_value(self, value: IRValue) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def state_updates(self) -> list[int]:
        """The values written back into delegate-owned state after a call:
        stored at the end of the call like outputs."""
        return [v.state_update for v in self.values if v.state_update >= 0]

    def producers(self) -> dict[int, IRNode]:
        return {node.output: node for node in self.nodes}

    def readers(self) -> dict[int, list[IRNode]]:
        """Value id -> the nodes reading it (a node once per distinct operand)."""
        result: dict[int, list[IRNode]] = {}
        for node in self.nodes:
            for ref in dict.fromkeys(node.operands()):
                result.setdefault(ref, []).append(node)
        return result
