"""The export side: what runs in ``to_edge(...).to_backend(...)`` /
``to_edge_transform_and_lower``.

:mod:`.partitioner` (``RustConvPartitioner``) tags the nodes the runtime can
run, grouped by :mod:`.partition_proposal` from the op kinds of
:mod:`.ops_lowering` (one class per kind; :mod:`.support` its older
functional face); :mod:`.backend` (``RustConvBackend.preprocess``) lowers a
partition (:mod:`.lowering` into :mod:`.ir`, dims in :mod:`.shapes`), groups
it into fused kernels (:mod:`.fusion`) and writes the blob
(:mod:`.graph_writer`, :mod:`.blob`, over the generated :mod:`rustconv.fb`).
:mod:`.lowering_call` reads ExecuTorch's partitioner list.

Nothing here loads the runtime or imports the developer tools.
"""
