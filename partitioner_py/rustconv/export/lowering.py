"""Lowering a partition (an edge ``ExportedProgram``) to the blob graph IR.

Walks the partition in graph order and asks each node's registered
:class:`~rustconv.export.ops_lowering.registry.OpLowering` to emit blob nodes through
a :class:`LoweringBuilder`. The builder owns the contract with the runtime
about inputs, outputs and constants:

* **Delegate inputs** are the program's placeholders that are *not* constants
  (parameters, buffers, lifted tensor constants), in graph order; input ``i``
  of the delegate call is the value with kind ``Input`` and ``io_index == i``.
* **State**: a mutated buffer handed to the partition (the partitioner tags
  it with ExecuTorch's ``tag_mutated_buffer``) becomes a ``State`` value: it
  starts at zero, as ExecuTorch's own mutable buffers do (the zeros are in the
  constant segment), and the
  program output that mutates it (``OutputKind.BUFFER_MUTATION``, the
  ``copy_`` of the model) becomes that value's ``state_update`` instead of a
  delegate output, so the runtime updates the state in place across calls.
* **Delegate outputs** are the program's user outputs, in order.
* Constants get values only when a blob node reads them (a 0-d constant folded
  into a ``*_scalar`` field costs nothing).
* A node computing a constant (:mod:`rustconv.export.ops_lowering.folding`: a view,
  cast or normalization of parameters) is evaluated here on the real tensors;
  its result is a ``Constant`` value like a parameter's.

Some nodes emit no blob node: a zero pad or a slice folded into a convolution
(its debug handles join the convolution's), a copy of a value that is never
materialised (an alias), a split (its pieces become slices), SymInts and
scalar constants (read from metadata and folded into their users).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind
from torch.fx import Node

from rustconv.errors import UnsupportedGraphError
from rustconv.export.ir import IRGraph, IRNode, IRValue
from rustconv.export.ops_lowering import GraphContext, lowering_for
from rustconv.export.ops_lowering.common import NotSupported, dim_expr, shape_exprs
from rustconv.export.ops_lowering.folding import computes_constant, evaluate
from rustconv.export.ops_lowering.registry import op_name, reason_for
from rustconv.export.ops_lowering.scalars import is_scalar_like, scalar_value
from rustconv.export.shapes import make_dims
from rustconv.fb.DType import DType
from rustconv.fb.Op import Op
from rustconv.fb.Unary import UnaryT
from rustconv.fb.UnaryOp import UnaryOp
from rustconv.fb.ValueKind import ValueKind

__all__ = ["DTYPES", "LoweringBuilder", "lower_program", "debug_handles"]

logger = logging.getLogger(__name__)

#: torch dtype -> (schema DType, little-endian numpy dtype for constant bytes)
DTYPES: dict[torch.dtype, tuple[int, str]] = {
    torch.float32: (DType.Float32, "<f4"),
    torch.float16: (DType.Float16, "<f2"),
}


def debug_handles(node: Node) -> list[int]:
    handle = node.meta.get("debug_handle")
    if handle is None:
        return []
    if isinstance(handle, int):
        return [handle]
    return [int(h) for h in handle]


def lower_program(ep: ExportedProgram) -> IRGraph:
    """The IR of a whole partition; raises ``UnsupportedGraphError`` with context."""
    return LoweringBuilder(ep).build()


class LoweringBuilder:
    """What an op's ``emit`` uses to read operands and add blob nodes."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        self.ctx = GraphContext(ep)
        self.ranges = dict(ep.range_constraints)
        self.graph = IRGraph(values=[], nodes=[], inputs=[], outputs=[])
        self._value_of: dict[Node, int] = {}
        self._producer: dict[int, IRNode] = {}
        self._inline: dict[Node, str] = {}
        self._pending_constants: set[Node] = set()
        #: Results of nodes evaluated at export, until a blob node reads them.
        self._folded: dict[Node, torch.Tensor] = {}
        #: Tensor items of nodes whose result is a tuple (a batch norm's output).
        #: The data of every Constant value, by value id (for ops that derive
        #: new constants from them, e.g. a batch norm folded into its conv).
        self._constant_data: dict[int, torch.Tensor] = {}

    # -- driver -------------------------------------------------------------

    def build(self) -> IRGraph:
        output_node = None
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "call_function":
                self._call_function(node)
            elif node.op == "output":
                output_node = node
            else:
                raise UnsupportedGraphError(f"RustConv cannot lower {node.op} node {node.name!r}")
        if output_node is None:
            raise UnsupportedGraphError("the subgraph has no output node")
        if not any(n.is_anchor for n in self.graph.nodes):
            raise UnsupportedGraphError(
                "the subgraph contains no RustConv convolution or linear scan"
            )
        self._outputs(output_node)
        self._drop_dead_nodes()
        return self.graph

    def _call_function(self, node: Node) -> None:
        if computes_constant(node, self.ctx):
            self._fold(node)
            return
        lowering = lowering_for(node)
        reason = reason_for(node, self.ctx)
        if reason is not None:
            raise UnsupportedGraphError(
                f"RustConv cannot lower {node.name!r} ({op_name(node)}): {reason}"
            )
        assert lowering is not None
        lowering.emit(node, self)

    # -- values -------------------------------------------------------------

    def tensor_meta(self, node: Node) -> torch.Tensor:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise UnsupportedGraphError(
                f"{node.name!r} is not a tensor (meta['val'] is {type(val).__name__}); "
                "RustConv values are tensors"
            )
        return val

    def _new_value(
        self,
        node: Node,
        kind: int,
        dtype: torch.dtype | None = None,
        is_mask: bool = False,
        **fields: Any,
    ) -> int:
        val = self.tensor_meta(node)
        dtype = dtype or val.dtype
        if dtype not in DTYPES:
            raise UnsupportedGraphError(
                f"{node.name!r} has dtype {dtype}; the blob format supports "
                f"{', '.join(str(d) for d in DTYPES)}"
            )
        value = IRValue(
            name=node.name,
            dtype=dtype,
            shape=shape_exprs(val),
            dims=make_dims(val.shape, self.ranges, repr(node.name)),
            kind=kind,
            is_mask=is_mask,
            **fields,
        )
        index = self.graph.add_value(value)
        self._value_of[node] = index
        return index

    def _placeholder(self, node: Node) -> None:
        if self.ctx.is_mutable_buffer(node):
            self._state(node)
            return
        if self.ctx.is_constant(node):
            # Materialised on first read (see value()); unused and folded
            # constants (0-d scalars) cost nothing.
            self._pending_constants.add(node)
            return
        val = self.tensor_meta(node)
        _check_default_dim_order(node, val)
        index = self._new_value(node, ValueKind.Input, io_index=len(self.graph.inputs))
        self.graph.inputs.append(index)

    def _state(self, node: Node) -> None:
        """A delegate-owned mutable buffer: the state starts at zero.

        ExecuTorch treats a mutated buffer's exported value as meaningless: it
        serializes only its shape and dtype (unless ``InitializedMutableBufferPass``
        marks it), and its runtimes start it from zero. The state RustConv owns
        starts from zero likewise, so a program computes the same with RustConv
        as without it, whatever the buffer held at export (a model run in eager
        first, or built on the meta device and materialised with ``to_empty``
        as ExecuTorch's llama example does).
        """
        from torch._export.utils import get_buffer

        tensor = get_buffer(self.ep, node)
        val = self.tensor_meta(node)
        _check_default_dim_order(node, val)
        if any(not isinstance(s, int) for s in val.shape):
            raise UnsupportedGraphError(
                f"state {node.name!r} has a dynamic shape {tuple(val.shape)}; "
                "delegate-owned state has a fixed size"
            )
        if val.dtype not in DTYPES:
            raise UnsupportedGraphError(
                f"state {node.name!r} has dtype {val.dtype}; the blob format supports "
                f"{', '.join(str(d) for d in DTYPES)}"
            )
        if (
            isinstance(tensor, torch.Tensor)
            and not isinstance(tensor, FakeTensor)
            and not tensor.is_meta
            and bool(tensor.detach().ne(0).any())
        ):
            logger.info(
                "state %r held non-zero values at export; like ExecuTorch's own mutable "
                "buffers, it starts from zero",
                node.name,
            )
        zeros = torch.zeros(tuple(val.shape), dtype=val.dtype)
        self._new_value(node, ValueKind.State, data=_constant_bytes(node, zeros, val))

    def _constant(self, node: Node, tensor: torch.Tensor | None = None) -> int:
        val = self.tensor_meta(node)
        if tensor is None:
            tensor = self.ctx.constant_tensor(node)
            _check_default_dim_order(node, val)
        # (An evaluated result is written row-major whatever its strides were.)
        assert tensor is not None
        data = _constant_bytes(node, tensor, val)
        self._pending_constants.discard(node)
        index = self._new_value(node, ValueKind.Constant, data=data)
        self._constant_data[index] = tensor
        return index

    def _fold(self, node: Node) -> None:
        """Evaluates a node computing a constant; its value is made when first read."""

        def source(arg: Node) -> torch.Tensor:
            if arg in self._folded:
                return self._folded[arg]
            tensor = self.ctx.constant_tensor(arg)
            if tensor is None:
                raise UnsupportedGraphError(
                    f"{node.name!r} is evaluated at export but reads {arg.name!r}, which is "
                    "not a constant of this subgraph"
                )
            if isinstance(tensor, FakeTensor) or tensor.is_meta:
                raise UnsupportedGraphError(
                    f"constant {arg.name!r} has no data (fake or meta tensor); export "
                    "the model with real weights"
                )
            return tensor

        try:
            self._folded[node] = evaluate(node, source)
        except NotSupported as e:
            raise UnsupportedGraphError(str(e)) from None

    def constant_data(self, index: int) -> torch.Tensor | None:
        """The tensor behind a Constant value, or None for any other value."""
        return self._constant_data.get(index)

    def new_constant(self, name: str, tensor: torch.Tensor) -> int:
        """A fresh Constant value holding ``tensor`` (computed by an op's lowering)."""
        tensor = tensor.detach().contiguous()
        if tensor.dtype not in DTYPES:
            raise UnsupportedGraphError(f"constant {name!r} has unsupported dtype {tensor.dtype}")
        value = IRValue(
            name=name,
            dtype=tensor.dtype,
            shape=shape_exprs(tensor),
            dims=make_dims(tensor.shape, self.ranges, repr(name)),
            kind=ValueKind.Constant,
            data=tensor.numpy().astype(np.dtype(DTYPES[tensor.dtype][1]), copy=False).tobytes(),
        )
        index = self.graph.add_value(value)
        self._constant_data[index] = tensor
        return index

    def value(self, arg: Any, consumer: Node, role: str) -> int:
        """The value a consumer reads as ``role``; refuses what has no tensor."""
        if isinstance(arg, Node):
            if arg in self._value_of:
                return self._value_of[arg]
            if arg in self._pending_constants:
                return self._constant(arg)
            if arg in self._folded:
                return self._constant(arg, self._folded[arg])
            if arg in self._inline:
                raise UnsupportedGraphError(
                    f"{consumer.name!r} reads {arg.name!r} as its {role}, but "
                    f"{arg.name!r} is {self._inline[arg]} and has no tensor of its own"
                )
        raise UnsupportedGraphError(
            f"{role} of {consumer.name!r} ({arg!r}) is not a tensor of the subgraph"
        )

    def operand(self, arg: Any, consumer: Node, role: str) -> tuple[int, float]:
        """(value, 0.0) for a tensor operand, (-1, number) for a scalar one."""
        if is_scalar_like(arg, self.ctx):
            return -1, scalar_value(arg, self.ctx)
        return self.value(arg, consumer, role), 0.0

    def scalar(self, arg: Any) -> float:
        return scalar_value(arg, self.ctx)

    def new_output(
        self, node: Node, dtype: torch.dtype | None = None, is_mask: bool = False
    ) -> int:
        """A fresh intermediate value for ``node``'s result."""
        return self._new_value(node, ValueKind.Intermediate, dtype=dtype, is_mask=is_mask)

    def derived_value(self, source: int, name: str) -> int:
        """A fresh intermediate value shaped like ``source`` (for helper nodes)."""
        like = self.graph.values[source]
        return self.graph.add_value(
            IRValue(
                name=name,
                dtype=like.dtype,
                shape=like.shape,
                dims=list(like.dims),
                kind=ValueKind.Intermediate,
            )
        )

    def new_intermediate(
        self, name: str, dtype: torch.dtype, shape: Sequence[int | torch.SymInt]
    ) -> int:
        """A fresh intermediate value of ``shape`` (a dynamic size a ``SymInt``)."""
        if dtype not in DTYPES:
            raise UnsupportedGraphError(f"{name!r} has unsupported dtype {dtype}")
        return self.graph.add_value(
            IRValue(
                name=name,
                dtype=dtype,
                shape=tuple(dim_expr(size) for size in shape),
                dims=make_dims(shape, self.ranges, repr(name)),
                kind=ValueKind.Intermediate,
            )
        )

    def value_like(self, node: Node, name: str, *, is_mask: bool = False) -> int:
        """A fresh intermediate value shaped like ``node``'s result but not
        bound to it (the output of a helper node among several emitting ``node``)."""
        val = self.tensor_meta(node)
        return self.graph.add_value(
            IRValue(
                name=name,
                dtype=val.dtype,
                shape=shape_exprs(val),
                dims=make_dims(val.shape, self.ranges, repr(name)),
                kind=ValueKind.Intermediate,
                is_mask=is_mask,
            )
        )

    def alias(self, node: Node, index: int, *, reshape: bool = False) -> None:
        """``node``'s result is the existing value ``index`` (no node emitted).

        ``reshape=True`` re-describes the value with ``node``'s shape (a slice
        folded into the convolution producing it); the caller guarantees
        nothing else reads the value under its old shape.
        """
        self._value_of[node] = index
        if reshape:
            val = self.tensor_meta(node)
            value = self.graph.values[index]
            value.shape = shape_exprs(val)
            value.dims = make_dims(val.shape, self.ranges, repr(node.name))

    def mark_inline(self, node: Node, what: str) -> None:
        """``node`` emits nothing; ``what`` says why, for error messages."""
        self._inline[node] = what

    def value_of(self, node: Node) -> int | None:
        return self._value_of.get(node)

    def producer(self, index: int) -> IRNode | None:
        return self._producer.get(index)

    # -- nodes --------------------------------------------------------------

    def add(self, node: Node, op_type: int, op: Any) -> IRNode:
        """Appends a blob node implementing (part of) ``node``."""
        ir = IRNode(op_type=op_type, op=op, name=node.name, debug_handles=debug_handles(node))
        self.graph.nodes.append(ir)
        self._producer[ir.output] = ir
        return ir

    def join_handles(self, ir: IRNode, node: Node) -> None:
        """``node`` was folded into ``ir``: profiling attributes it there."""
        ir.debug_handles = list(dict.fromkeys(ir.debug_handles + debug_handles(node)))

    def identity(self, node: Node, source: int) -> int:
        """Emits ``Unary Identity`` (a copy) of ``source`` as ``node``'s result."""
        op = UnaryT()
        op.op = UnaryOp.Identity
        op.input = source
        op.output = self.new_output(node, dtype=self.graph.values[source].dtype)
        self.add(node, Op.Unary, op)
        return op.output

    # -- outputs ------------------------------------------------------------

    def _outputs(self, output_node: Node) -> None:
        results = output_node.args[0]
        if not isinstance(results, (list, tuple)):
            results = (results,)
        specs = self.ep.graph_signature.output_specs
        mutations = {
            i: spec.target
            for i, spec in enumerate(specs)
            if spec.kind == OutputKind.BUFFER_MUTATION
        }
        states = {
            self.ep.graph_signature.inputs_to_buffers.get(node.name): index
            for node, index in self._value_of.items()
            if self.graph.values[index].kind == ValueKind.State
        }
        user_results = []
        for position, result in enumerate(results):
            if position not in mutations:
                user_results.append(result)
                continue
            target = mutations[position]
            if target not in states:
                raise UnsupportedGraphError(
                    f"output {position} mutates buffer {target!r}, which the subgraph does not own"
                )
            self._state_update(states.pop(target), result, output_node)
        for target in states:
            raise UnsupportedGraphError(f"state {target!r} is never updated in the subgraph")
        seen: dict[Node, int] = {}
        for io_index, result in enumerate(user_results):
            if isinstance(result, Node) and result in seen:
                raise UnsupportedGraphError(
                    f"{result.name!r} is returned more than once (outputs "
                    f"{seen[result]} and {io_index}); RustConv writes each value "
                    "to one output"
                )
            index = self.value(result, output_node, f"output {io_index}")
            value = self.graph.values[index]
            if value.kind in (ValueKind.Input, ValueKind.Constant):
                what = "input" if value.kind == ValueKind.Input else "constant"
                raise UnsupportedGraphError(
                    f"output {io_index} is the {what} {result.name!r} itself; "
                    "pass-through outputs are not supported"
                )
            if value.is_mask:
                raise UnsupportedGraphError(
                    f"output {io_index} ({result.name!r}) is a comparison's bool result; "
                    "RustConv keeps those inside the delegate"
                )
            if value.kind == ValueKind.Output:
                # Two results folded onto one value (e.g. y and y.clone()):
                # the second gets its own copy.
                index = self.identity(result, index)
                value = self.graph.values[index]
            value.kind = ValueKind.Output
            value.io_index = io_index
            self.graph.outputs.append(index)
            seen[result] = io_index

    def _state_update(self, state: int, result: Any, output_node: Node) -> None:
        update = self.value(result, output_node, "state update")
        value = self.graph.values[update]
        if value.kind != ValueKind.Intermediate or value.is_mask:
            raise UnsupportedGraphError(
                f"the new value of state {self.graph.values[state].name!r} is "
                f"{result.name!r}, which is not computed in the subgraph"
            )

        def sizes(v: IRValue) -> list[tuple[int, bool]]:
            return [(d.size, d.dynamic) for d in v.dims]

        if sizes(value) != sizes(self.graph.values[state]):
            raise UnsupportedGraphError(
                f"the new value of state {self.graph.values[state].name!r} has "
                f"dims {sizes(value)}, the state {sizes(self.graph.values[state])}"
            )
        self.graph.values[state].state_update = update

    def _drop_dead_nodes(self) -> None:
        """Removes nodes whose result nobody reads (left by folding), to a fixpoint."""
        while True:
            read = {ref for n in self.graph.nodes for ref in n.operands()}
            read.update(self.graph.outputs)
            read.update(self.graph.state_updates())
            live = [n for n in self.graph.nodes if n.output in read]
            if len(live) == len(self.graph.nodes):
                return
            self.graph.nodes = live


def _constant_bytes(node: Node, tensor: torch.Tensor, val: torch.Tensor) -> bytes:
    """Contiguous little-endian bytes of a constant, checked against its metadata."""
    if isinstance(tensor, FakeTensor) or tensor.is_meta:
        raise UnsupportedGraphError(
            f"constant {node.name!r} has no data (fake or meta tensor); export "
            "the model with real weights"
        )
    if tensor.dtype != val.dtype or tuple(tensor.shape) != tuple(val.shape):
        raise UnsupportedGraphError(
            f"constant {node.name!r} is {tensor.dtype}{list(tensor.shape)} but the "
            f"graph expects {val.dtype}{list(val.shape)}"
        )
    if val.dtype not in DTYPES:
        raise UnsupportedGraphError(
            f"constant {node.name!r} has dtype {val.dtype}; the blob format supports "
            f"{', '.join(str(d) for d in DTYPES)}"
        )
    array = tensor.detach().to("cpu").contiguous().numpy()
    return array.astype(np.dtype(DTYPES[val.dtype][1]), copy=False).tobytes()


def _check_default_dim_order(node: Node, val: torch.Tensor) -> None:
    """RustConv tensors are contiguous (row-major); refuse any other layout."""
    try:
        dim_order = tuple(val.dim_order())
    except Exception:  # symbolic strides that cannot be ordered
        contiguous = bool(val.is_contiguous())
    else:
        contiguous = dim_order == tuple(range(val.dim()))
    if not contiguous:
        raise UnsupportedGraphError(
            f"{node.name!r} is not contiguous (dim order / strides "
            f"{tuple(val.stride())}); RustConv expects row-major tensors"
        )
