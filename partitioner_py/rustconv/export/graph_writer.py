"""Writing the (fused) IR as the schema's ``Graph``, constants and debug map.

This is where values and nodes get their numbers: values in IR order, keeping
every delegate input (its ``io_index`` is fixed by the call) and dropping
values nothing reads any more (constants folded into scalars, originals of
duplicated nodes); nodes in their final order, ``Node.id`` being the position.
The debug-handle map has one entry per fused kernel, keyed by its index
(``Node.kernel``), holding the debug handles of every op the kernel absorbed:
the runtime logs each kernel's profiling event with that index, so the
Inspector names the model's ops under it.
"""

from __future__ import annotations

from executorch.exir.backend.utils import DelegateMappingBuilder

from rustconv.export.blob import align_up
from rustconv.export.ir import IRGraph
from rustconv.export.lowering import DTYPES
from rustconv.fb.Graph import GraphT
from rustconv.fb.Node import NodeT
from rustconv.fb.Value import ValueT
from rustconv.fb.ValueKind import ValueKind

__all__ = ["write_graph"]


def write_graph(graph: IRGraph) -> tuple[GraphT, list[bytes], dict[int, tuple[int, ...]]]:
    """(flatbuffer graph, constant payloads in segment order, debug handle map).

    The constants' offsets assume :func:`rustconv.export.blob.pack_constants`'s layout.
    """
    used = set(graph.inputs) | set(graph.outputs) | set(graph.state_updates())
    for node in graph.nodes:
        used.update(node.operands())
        used.add(node.output)

    index: dict[int, int] = {}
    values: list[ValueT] = []
    constants: list[bytes] = []
    segment_end = 0
    for vid, value in enumerate(graph.values):
        if vid not in used:
            continue
        out = ValueT()
        out.name = value.name
        out.dtype = DTYPES[value.dtype][0]
        out.dims = value.dims
        out.kind = value.kind
        out.ioIndex = value.io_index
        if value.kind in (ValueKind.Constant, ValueKind.State):
            assert value.data is not None
            offset = align_up(segment_end)
            segment_end = offset + len(value.data)
            constants.append(value.data)
            out.constantOffset, out.constantSize = offset, len(value.data)
        index[vid] = len(values)
        values.append(out)

    for vid, value in enumerate(graph.values):
        if vid in index and value.kind == ValueKind.State:
            values[index[vid]].stateUpdate = index[value.state_update]

    kernel_handles: dict[int, list[int]] = {}
    nodes = []
    for position, node in enumerate(graph.nodes):
        renumbered = node.remapped(index, output=index[node.output])
        fb_node = NodeT()
        fb_node.opType = node.op_type
        fb_node.op = renumbered.op
        fb_node.id = position
        fb_node.debugHandles = list(node.debug_handles)
        fb_node.name = node.name
        fb_node.kernel = node.kernel
        nodes.append(fb_node)
        handles = kernel_handles.setdefault(node.kernel, [])
        handles.extend(h for h in node.debug_handles if h not in handles)

    debug_map = DelegateMappingBuilder(generated_identifiers=False)
    for kernel, handles in kernel_handles.items():
        if handles:
            debug_map.insert_delegate_mapping_entry(handles=handles, identifier=kernel)

    result = GraphT()
    result.values = values
    result.inputs = [index[v] for v in graph.inputs]
    result.outputs = [index[v] for v in graph.outputs]
    result.nodes = nodes
    return result, constants, debug_map.get_delegate_mapping()
