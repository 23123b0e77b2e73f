"""RustConv: an ExecuTorch delegate for 1-D convolutions and linear scans,
with the elementwise and view ops around them fused into their kernels.

Export side::

    import rustconv
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, example_inputs)
    program = to_edge_transform_and_lower(
        ep, partitioner=[rustconv.RustConvPartitioner()]
    ).to_executorch()

Importing the package registers ``torch.ops.rustconv.linear_scan``. It does
*not* load the Rust runtime; ``import rustconv.runtime`` does that explicitly,
so exporting works on machines without the compiled library.

The package by role: :mod:`rustconv.export` (partitioner, ``preprocess``, op
kinds, fusion, blob writer), :mod:`rustconv.runtime` and :mod:`rustconv.native`
(loading the library, finding it and pte_runner), :mod:`rustconv.devtools`
(``python -m rustconv.inspect`` / ``profile``, ETDump reading, the pte_runner
driver, ``check_others_unchanged``, the blob interpreter),
:mod:`rustconv.guided` (``GuidedPartitioner``: profile-guided partitioning on
top of the partitioner) and :mod:`rustconv.examples` (the example blocks).
The former top-level modules (``rustconv.partitioner``, ``rustconv.inspect``,
``rustconv.profiling``, ``rustconv.blocks``, ...) re-export their new homes.
"""

from rustconv import ops  # noqa: F401  (registers torch.ops.rustconv.linear_scan)
from rustconv.compile_specs import algorithm, num_threads
from rustconv.errors import DynamicShapeError, RustConvError, UnsupportedGraphError
from rustconv.export.backend import RustConvBackend
from rustconv.export.partitioner import RustConvPartitioner
from rustconv.ops import linear_scan

__all__ = [
    "RustConvPartitioner",
    "RustConvBackend",
    "linear_scan",
    "num_threads",
    "algorithm",
    "RustConvError",
    "UnsupportedGraphError",
    "DynamicShapeError",
]
