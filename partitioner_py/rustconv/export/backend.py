"""``RustConvBackend``: turns a tagged subgraph into a RustConv delegate blob.

ExecuTorch calls :meth:`RustConvBackend.preprocess` once per partition with
that partition as a standalone edge ``ExportedProgram``. It goes through three
steps, each in its own module:

1. :mod:`rustconv.export.lowering` - every node, through its registered op lowering,
   becomes blob nodes over values (or folds away); inputs, outputs and
   constants follow the delegate-call contract described there;
2. :mod:`rustconv.export.fusion` - the nodes are grouped into fused kernels
   (``Node.kernel``), possibly reordered and duplicated, following
   ``schema/README.md``; the compile spec ``fusion`` (0) turns this off;
3. :mod:`rustconv.export.graph_writer` - values and nodes are numbered and written as
   the flatbuffer ``Graph`` of ``schema/rustconv.fbs``, serialised with the
   constant segment by :mod:`rustconv.export.blob`.

Contract with the runtime (the Rust side relies on every point):

* **Delegate inputs** are the program's placeholders that are *not* constants,
  in graph order; input ``i`` is the ``Value`` with kind ``Input`` and
  ``io_index == i``, and ``Graph.inputs[i]``.
* **Delegate outputs** are the entries of the program's output node, in
  order: output ``i`` is the ``Value`` with kind ``Output`` and
  ``io_index == i``, and ``Graph.outputs[i]``.
* **Nodes** are in execution (topological) order, grouped by kernel;
  ``Node.id`` is the node's position. ``Node.kernel`` is the key of the
  ``debug_handle_map`` this returns, whose entry holds the debug handles of
  every op the kernel absorbed: the runtime logs one profiling event per
  fused kernel with that index as the delegate debug id.
  ``Node.debug_handles`` holds each node's own handles; a duplicated node's
  copies share them.
* A ``constant_pad_nd`` or a padding-only ``slice`` folded into a convolution
  produces no ``Value`` and no ``Node``; its amounts change the convolution's
  ``pad_left``/``pad_right`` and its debug handle joins the convolution's.
* **Dims**: see :mod:`rustconv.export.shapes` (dynamic sizes are upper bounds).
"""

from __future__ import annotations

from typing import final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from rustconv.backend_id import BACKEND_ID
from rustconv.compile_specs import fusion_enabled, validate_compile_specs
from rustconv.export.blob import serialize_blob
from rustconv.export.fusion import assign_kernels
from rustconv.export.graph_writer import write_graph
from rustconv.export.lowering import lower_program
from rustconv.fb.Graph import GraphT

__all__ = ["RustConvBackend", "build_graph"]


@final
class RustConvBackend(BackendDetails):
    """ExecuTorch backend for RustConv. The class name is the backend id in the
    ``.pte`` (:data:`rustconv.backend_id.BACKEND_ID`, checked below)."""

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram,
        compile_specs: list[CompileSpec],
    ) -> PreprocessResult:
        # Compile specs travel next to the blob in the .pte; they are checked
        # here so a hand-built DelegationSpec fails early too.
        specs = validate_compile_specs(compile_specs)
        graph, constants, debug_handle_map = build_graph(edge_program, fusion=fusion_enabled(specs))
        return PreprocessResult(
            processed_bytes=serialize_blob(graph, constants),
            debug_handle_map=debug_handle_map,
        )


# ExecuTorch finds the backend by its class name: it must be the one id.
if RustConvBackend.__name__ != BACKEND_ID:
    raise ImportError(f"RustConvBackend is named {RustConvBackend.__name__!r}, not {BACKEND_ID!r}")


def build_graph(
    edge_program: ExportedProgram, fusion: bool = True
) -> tuple[GraphT, list[bytes], dict[int, tuple[int, ...]]]:
    """Translates a partition into (graph, constant payloads, debug handle map).

    The constant payloads are in segment order and the graph's constant
    offsets already assume :func:`rustconv.export.blob.pack_constants` layout.
    """
    ir = lower_program(edge_program)
    return write_graph(assign_kernels(ir, enabled=fusion))
