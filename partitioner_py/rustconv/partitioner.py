"""``RustConvPartitioner``: tags the nodes the RustConv runtime can execute.

It delegates

* every 1-D convolution (``aten.convolution`` on a 3-D input, not transposed,
  or ``aten.conv1d`` in either overload), any stride/padding/dilation/groups,
  with or without bias;
* every ``rustconv.linear_scan``;
* a zero ``constant_pad_nd`` of the last dimension whose only user is such a
  convolution (it becomes the convolution's ``pad_left``/``pad_right``);

when all their tensors have a dtype in :data:`rustconv.support.SUPPORTED_DTYPES`
(float32 and float16). Connected supported nodes are grouped by torch.fx's
``CapabilityBasedPartitioner``; each group gets its own delegation tag and
becomes one ``RustConvBackend`` delegate call.

Weights and biases that are constants (parameters, buffers, lifted tensors)
are tagged with ``tag_constant_data`` so the delegate owns them: they go into
the blob's constant segment. A weight that is a graph input, or is computed by
ops outside the delegate, stays a regular delegate input.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase

from rustconv.backend import RustConvBackend
from rustconv.compile_specs import validate_compile_specs
from rustconv.support import (
    conv_unsupported_reason,
    is_conv,
    is_pad,
    is_scan,
    pad_unsupported_reason,
    unsupported_reason,
)

__all__ = ["RustConvPartitioner", "TAG_PREFIX"]

logger = logging.getLogger(__name__)

#: Delegation tags are ``f"{TAG_PREFIX}{partition id}"``.
TAG_PREFIX = "rustconv_"

# The conv1d overloads ``ops_to_not_decompose`` preserves. ``aten.convolution``
# is core ATen and never decomposed, so it needs no entry.
_CONV1D_OVERLOADS = [torch.ops.aten.conv1d.default, torch.ops.aten.conv1d.padding]


class _RustConvSupport(OperatorSupportBase):
    """Adapter from :func:`rustconv.support.unsupported_reason` to torch.fx."""

    def __init__(self, fuse_pads: bool = True) -> None:
        super().__init__()
        self._fuse_pads = fuse_pads

    def is_node_supported(self, submodules, node: Node) -> bool:
        if node.op != "call_function":
            return False
        if is_pad(node) and not self._fuse_pads:
            return False
        reason = unsupported_reason(node)
        if reason is not None and (is_conv(node) or is_scan(node)):
            # Only our own op kinds: "aten.add is not a RustConv op" is noise.
            logger.info("RustConv does not take %s: %s", node.name, reason)
        return reason is None


class RustConvPartitioner(Partitioner):
    """Partitioner for the RustConv backend (backend id ``"RustConvBackend"``).

    Args:
        compile_specs: passed unchanged to every delegate; build them with
            :mod:`rustconv.compile_specs` (e.g. ``num_threads(4)``). Unknown
            keys are refused here rather than at load time.

    Works with both lowering flows::

        to_edge(ep).to_backend(RustConvPartitioner())
        to_edge_transform_and_lower(ep, partitioner=[RustConvPartitioner(), ...])
    """

    def __init__(self, compile_specs: list[CompileSpec] | None = None) -> None:
        super().__init__()
        self.delegation_spec = DelegationSpec(
            RustConvBackend.__name__, validate_compile_specs(compile_specs or [])
        )

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        graph_module = exported_program.graph_module
        partitions = self._propose(graph_module, fuse_pads=True)
        if not _pads_share_partition_with_user(partitions):
            # Cannot happen with the current CapabilityBasedPartitioner (a
            # single-user pad always merges with its user), but if a future
            # version splits them, fall back to a layout that is always valid
            # instead of producing a subgraph preprocess must reject.
            logger.warning(
                "RustConv: a fused pad landed outside its convolution's partition; "
                "re-partitioning with pads attached afterwards"
            )
            partitions = self._propose(graph_module, fuse_pads=False)
            _absorb_pads(partitions, graph_module)

        partition_tags: dict[str, DelegationSpec] = {}
        for partition in partitions:
            tag = f"{TAG_PREFIX}{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            partition_tags[tag] = self.delegation_spec

        # Constant weights/biases used only by our nodes become delegate-owned.
        tag_constant_data(exported_program)
        return PartitionResult(
            tagged_exported_program=exported_program, partition_tags=partition_tags
        )

    @staticmethod
    def _propose(graph_module: torch.fx.GraphModule, fuse_pads: bool) -> list[Partition]:
        return CapabilityBasedPartitioner(
            graph_module,
            _RustConvSupport(fuse_pads=fuse_pads),
            # A lone convolution is worth delegating.
            allows_single_node_partition=True,
        ).propose_partitions()

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool] | None]:
        """Keeps supported ``aten.conv1d`` nodes whole in ``to_edge_transform_and_lower``.

        Without this, ``aten.conv1d`` (a CompositeImplicitAutograd op) is
        decomposed to ``aten.convolution``, and ``padding="same"`` with an even
        kernel extent additionally to a ``constant_pad_nd``. The filter keeps
        only nodes this partitioner will tag: ExecuTorch raises after lowering
        if a preserved node is left undelegated, so unsupported ones (fp64, 2-D
        inputs) must decompose as usual for other backends or the portable
        kernels.

        ExecuTorch 1.5.1 runs one decomposition pass per partitioner, each
        sparing only that partitioner's own ops. With another partitioner in
        the list (in either order) its pass decomposes conv1d anyway, so the
        partitioner then sees ``aten.convolution`` (plus a pad for even
        "same"), which it handles too; and our pass likewise decomposes the
        other partitioner's preserved ops (XNNPACK's ``aten.linear``).
        """
        return list(_CONV1D_OVERLOADS), _keep_conv1d_whole


def _keep_conv1d_whole(node: Node) -> bool:
    return is_conv(node) and conv_unsupported_reason(node) is None


def _pads_share_partition_with_user(partitions: list[Partition]) -> bool:
    owner = {node: p.id for p in partitions for node in p.nodes}
    return all(owner.get(next(iter(node.users))) == owner[node] for node in owner if is_pad(node))


def _absorb_pads(partitions: list[Partition], graph_module: torch.fx.GraphModule) -> None:
    """Adds each fusable pad to the partition of its single consuming conv.

    This never creates a cycle: the pad's only edge into the partition is its
    user, so a path from the partition back into the pad would already be a
    path leaving and re-entering the partition, which the partitioner rules out.
    """
    by_node = {node: p for p in partitions for node in p.nodes}
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and is_pad(node):
            if pad_unsupported_reason(node) is None:
                user = next(iter(node.users))
                if user in by_node:
                    by_node[user].add_node(node)
