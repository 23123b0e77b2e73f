"""``RustConvBackend``: turns a tagged subgraph into a RustConv delegate blob.

ExecuTorch calls :meth:`RustConvBackend.preprocess` once per partition with
that partition as a standalone edge ``ExportedProgram``. It is translated into
the flatbuffer ``Graph`` of ``schema/rustconv.fbs`` plus a constant segment,
and serialised by :mod:`rustconv.blob`.

Contract with the runtime (the Rust side relies on every point):

* **Delegate inputs** are the program's placeholders that are *not* constants
  (parameters, buffers, lifted tensor constants), in graph order; input ``i``
  of the ``executorch_call_delegate`` is the ``Value`` with kind ``Input`` and
  ``io_index == i``, and ``Graph.inputs[i]``. Constants owned by the delegate
  are not delegate inputs; their bytes are in the blob.
* **Delegate outputs** are the entries of the program's output node, in
  order: output ``i`` is the ``Value`` with kind ``Output`` and
  ``io_index == i``, and ``Graph.outputs[i]``.
* **Nodes** are in execution (topological) order; ``Node.id`` is the node's
  position and is the key of the ``debug_handle_map`` this returns, so the
  runtime should log profiling events with ``Node.id`` as the delegate debug
  index. ``Node.debug_handles`` holds the same handles.
* A ``constant_pad_nd`` fused into a convolution produces no ``Value`` and no
  ``Node``; its amounts are added to the convolution's ``pad_left``/
  ``pad_right`` and its debug handle joins the convolution's.
* **Dims**: see :mod:`rustconv.shapes` (dynamic sizes are upper bounds).
"""

from __future__ import annotations

from typing import Any, final

import numpy as np
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.utils import DelegateMappingBuilder
from torch._export.utils import (
    get_buffer,
    get_lifted_tensor_constant,
    get_param,
    is_buffer,
    is_lifted_tensor_constant,
    is_param,
)
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.fx import Node

from rustconv.blob import align_up, serialize_blob
from rustconv.compile_specs import validate_compile_specs
from rustconv.errors import UnsupportedGraphError
from rustconv.fb.Conv1d import Conv1dT
from rustconv.fb.DType import DType
from rustconv.fb.Graph import GraphT
from rustconv.fb.LinearScan import LinearScanT
from rustconv.fb.Node import NodeT
from rustconv.fb.Op import Op
from rustconv.fb.Value import ValueT
from rustconv.fb.ValueKind import ValueKind
from rustconv.shapes import make_dims
from rustconv.support import (
    conv_params,
    is_conv,
    is_pad,
    is_scan,
    pad_amounts,
    scan_operands,
    unsupported_reason,
)

__all__ = ["RustConvBackend", "build_graph"]


# torch dtype -> (schema DType, little-endian numpy dtype for the constant bytes)
_DTYPES: dict[torch.dtype, tuple[int, str]] = {
    torch.float32: (DType.Float32, "<f4"),
    torch.float16: (DType.Float16, "<f2"),
}


@final
class RustConvBackend(BackendDetails):
    """ExecuTorch backend for RustConv. The class name is the backend id in the ``.pte``."""

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram,
        compile_specs: list[CompileSpec],
    ) -> PreprocessResult:
        # Compile specs travel next to the blob in the .pte; they are only
        # checked here so a hand-built DelegationSpec fails early too.
        validate_compile_specs(compile_specs)
        graph, constants, debug_handle_map = build_graph(edge_program)
        return PreprocessResult(
            processed_bytes=serialize_blob(graph, constants),
            debug_handle_map=debug_handle_map,
        )


def build_graph(
    edge_program: ExportedProgram,
) -> tuple[GraphT, list[bytes], dict[int, tuple[int, ...]]]:
    """Translates a partition into (graph, constant payloads, debug handle map).

    The constant payloads are in segment order and the graph's constant
    offsets already assume :func:`rustconv.blob.pack_constants` layout.
    """
    return _GraphBuilder(edge_program).build()


def _debug_handles(node: Node) -> list[int]:
    handle = node.meta.get("debug_handle")
    if handle is None:
        return []
    if isinstance(handle, int):
        return [handle]
    return [int(h) for h in handle]


class _GraphBuilder:
    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        self.ranges = dict(ep.range_constraints)
        self.values: list[ValueT] = []
        self.value_of: dict[Node, int] = {}
        # fused pad node -> (its input, left, right)
        self.fused_pads: dict[Node, tuple[Node, int, int]] = {}
        self.nodes: list[NodeT] = []
        self.constants: list[bytes] = []
        self.segment_end = 0
        self.num_inputs = 0
        self.debug_map = DelegateMappingBuilder(generated_identifiers=False)

    # -- driver -------------------------------------------------------------

    def build(self) -> tuple[GraphT, list[bytes], dict[int, tuple[int, ...]]]:
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
        if not self.nodes:
            raise UnsupportedGraphError("the subgraph contains no RustConv operation")
        outputs = self._outputs(output_node)

        graph = GraphT()
        graph.values = self.values
        graph.inputs = sorted(
            (i for i, v in enumerate(self.values) if v.kind == ValueKind.Input),
            key=lambda i: self.values[i].ioIndex,
        )
        graph.outputs = outputs
        graph.nodes = self.nodes
        return graph, self.constants, self.debug_map.get_delegate_mapping()

    # -- values -------------------------------------------------------------

    def _tensor_meta(self, node: Node) -> torch.Tensor:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise UnsupportedGraphError(
                f"{node.name!r} is not a tensor (meta['val'] is {type(val).__name__}); "
                "RustConv values are tensors"
            )
        if val.dtype not in _DTYPES:
            raise UnsupportedGraphError(
                f"{node.name!r} has dtype {val.dtype}; the blob format supports "
                f"{', '.join(str(d) for d in _DTYPES)}"
            )
        return val

    def _add_value(self, node: Node, kind: int, **fields: Any) -> int:
        val = self._tensor_meta(node)
        value = ValueT()
        value.name = node.name
        value.dtype = _DTYPES[val.dtype][0]
        value.dims = make_dims(val.shape, self.ranges, repr(node.name))
        value.kind = kind
        for name, field in fields.items():
            setattr(value, name, field)
        self.values.append(value)
        self.value_of[node] = len(self.values) - 1
        return len(self.values) - 1

    def _value(self, node: Any, consumer: Node, role: str) -> int:
        if isinstance(node, Node) and node in self.fused_pads:
            raise UnsupportedGraphError(
                f"{consumer.name!r} uses the fused pad {node.name!r} as its {role}; "
                "a pad can only be fused into the input of a convolution"
            )
        if not isinstance(node, Node) or node not in self.value_of:
            raise UnsupportedGraphError(
                f"{role} of {consumer.name!r} ({node!r}) is not a tensor of the subgraph"
            )
        return self.value_of[node]

    def _placeholder(self, node: Node) -> None:
        val = self._tensor_meta(node)
        _check_default_dim_order(node, val)
        tensor = _constant_tensor(self.ep, node)
        if tensor is None:
            self._add_value(node, ValueKind.Input, ioIndex=self.num_inputs)
            self.num_inputs += 1
            return
        if not node.users:
            return  # an unused constant costs nothing at runtime
        data = _constant_bytes(node, tensor, val)
        offset = align_up(self.segment_end)
        self.segment_end = offset + len(data)
        self.constants.append(data)
        self._add_value(node, ValueKind.Constant, constantOffset=offset, constantSize=len(data))

    # -- operations ---------------------------------------------------------

    def _call_function(self, node: Node) -> None:
        reason = unsupported_reason(node)
        if reason is not None:
            raise UnsupportedGraphError(
                f"RustConv cannot lower {node.name!r} ({node.target}): {reason}"
            )
        if is_pad(node):
            left, right = pad_amounts(node)
            self.fused_pads[node] = (node.args[0], left, right)
        elif is_conv(node):
            self._conv(node)
        elif is_scan(node):
            self._scan(node)
        else:  # unsupported_reason() accepts nothing else
            raise AssertionError(f"unhandled supported node {node.name}")

    def _emit(self, node: Node, op_type: int, op: Any, handles: list[int]) -> None:
        fb_node = NodeT()
        fb_node.opType = op_type
        fb_node.op = op
        fb_node.id = len(self.nodes)
        fb_node.debugHandles = handles
        fb_node.name = node.name
        self.nodes.append(fb_node)
        if handles:
            self.debug_map.insert_delegate_mapping_entry(handles=handles, identifier=fb_node.id)

    def _conv(self, node: Node) -> None:
        p = conv_params(node)
        source, extra_left, extra_right = p.input, 0, 0
        handles = []
        if source in self.fused_pads:
            pad = source
            source, extra_left, extra_right = self.fused_pads[pad]
            handles += _debug_handles(pad)
        handles += _debug_handles(node)
        # A pad from decomposing conv1d(padding="same") shares the conv's handle.
        handles = list(dict.fromkeys(handles))

        conv = Conv1dT()
        conv.input = self._value(source, node, "input")
        conv.weight = self._value(p.weight, node, "weight")
        conv.bias = -1 if p.bias is None else self._value(p.bias, node, "bias")
        conv.stride = p.stride
        conv.padLeft = p.pad_left + extra_left
        conv.padRight = p.pad_right + extra_right
        conv.dilation = p.dilation
        conv.groups = p.groups
        conv.output = self._add_value(node, ValueKind.Intermediate)
        self._emit(node, Op.Conv1d, conv, handles)

    def _scan(self, node: Node) -> None:
        x0, a, u = scan_operands(node)
        scan = LinearScanT()
        scan.x0 = self._value(x0, node, "x0")
        scan.a = self._value(a, node, "a")
        scan.u = self._value(u, node, "u")
        scan.output = self._add_value(node, ValueKind.Intermediate)
        self._emit(node, Op.LinearScan, scan, _debug_handles(node))

    # -- outputs ------------------------------------------------------------

    def _outputs(self, output_node: Node) -> list[int]:
        results = output_node.args[0]
        if not isinstance(results, (list, tuple)):
            results = (results,)
        indices = []
        for io_index, result in enumerate(results):
            index = self._value(result, output_node, f"output {io_index}")
            value = self.values[index]
            if value.kind == ValueKind.Output:
                raise UnsupportedGraphError(
                    f"{result.name!r} is returned more than once (outputs "
                    f"{value.ioIndex} and {io_index}); RustConv writes each value "
                    "to one output"
                )
            if value.kind != ValueKind.Intermediate:
                what = "input" if value.kind == ValueKind.Input else "constant"
                raise UnsupportedGraphError(
                    f"output {io_index} is the {what} {result.name!r} itself; "
                    "pass-through outputs are not supported"
                )
            value.kind = ValueKind.Output
            value.ioIndex = io_index
            indices.append(index)
        return indices


def _constant_tensor(ep: ExportedProgram, node: Node) -> torch.Tensor | None:
    """The tensor behind a parameter/buffer/lifted-constant placeholder, else None."""
    if is_param(ep, node):
        return get_param(ep, node)
    if is_buffer(ep, node):
        if ep.graph_signature.buffers_to_mutate:
            mutated = set(ep.graph_signature.buffers_to_mutate.values())
            if ep.graph_signature.inputs_to_buffers[node.name] in mutated:
                raise UnsupportedGraphError(
                    f"buffer {node.name!r} is mutated; RustConv does not own mutable state"
                )
        return get_buffer(ep, node)
    if is_lifted_tensor_constant(ep, node):
        return get_lifted_tensor_constant(ep, node)
    return None


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
    array = tensor.detach().to("cpu").contiguous().numpy()
    return array.astype(np.dtype(_DTYPES[val.dtype][1]), copy=False).tobytes()


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
