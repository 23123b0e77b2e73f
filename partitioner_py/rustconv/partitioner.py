"""``RustConvPartitioner``: tags the nodes the RustConv runtime can execute.

Partitions grow from every supported 1-D convolution and
``rustconv.linear_scan`` across the ops around them (elementwise math, gates,
pads, slices, transposes, chunks, concatenations; see
:mod:`rustconv.ops_lowering` for the list), so that a whole block becomes one
``RustConvBackend`` delegate call whose blob records how the runtime fuses it
(:mod:`rustconv.fusion`). Linears, matmuls and anything else are left to the
next partitioner. The grouping rules are in :mod:`rustconv.partition_proposal`;
:meth:`RustConvPartitioner.explain` says why each node was not taken.

Weights and biases that are constants (parameters, buffers, lifted tensors)
are tagged with ``tag_constant_data`` so the delegate owns them: they go into
the blob's constant segment. A weight that is a graph input, or is computed by
ops outside the delegate, stays a regular delegate input. A mutated buffer
that feeds a partition (a convolution's ``conv_state`` updated with ``copy_``,
a scan's initial state) is tagged with ExecuTorch's ``tag_mutated_buffer``, as
its CoreML, MLX and Vulkan partitioners do: the delegate owns it (see
:mod:`rustconv.lowering`), keeps it across calls and updates it in place, and
ExecuTorch drops its ``copy_`` back. ``stateful=False`` keeps the previous
behaviour (the buffer a delegate input, its new value a delegate output).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind
from torch.fx import Node

from rustconv.backend import RustConvBackend
from rustconv.compile_specs import validate_compile_specs
from rustconv.ops_lowering import GraphContext, aten_op, lowering_for
from rustconv.partition_proposal import Proposal, partition_key, propose, propose_graph

__all__ = ["RustConvPartitioner", "TAG_PREFIX"]

logger = logging.getLogger(__name__)

#: Delegation tags are ``f"{TAG_PREFIX}{partition id}"``.
TAG_PREFIX = "rustconv_"

_aten = torch.ops.aten
# Ops ``ops_to_not_decompose`` may keep whole. ``aten.convolution`` is core
# ATen and never decomposed, so it needs no entry; softplus would otherwise
# decompose into exp, log1p, gt and where.
_KEEP_WHOLE = [_aten.conv1d.default, _aten.conv1d.padding, _aten.softplus.default]


class RustConvPartitioner(Partitioner):
    """Partitioner for the RustConv backend (backend id ``"RustConvBackend"``).

    Args:
        compile_specs: passed unchanged to every delegate; build them with
            :mod:`rustconv.compile_specs` (e.g. ``num_threads(4)``). Unknown
            keys are refused here rather than at load time.
        profile: profile-guided partitioning (:mod:`rustconv.guided`): a
            directory of variants run on the target
            (:func:`rustconv.guided.export_variants`), a decision saved by an
            earlier run or its dict, or ``"measure"`` to time every candidate
            here, delegated and left to ``rest`` (lowered from ``program``,
            the exported ATen program); only the candidates that are faster
            in RustConv are taken. The decision is printed.
        rest: the partitioners that follow this one (what a candidate is
            left to when measuring; none: ExecuTorch's CPU kernels).
        decision_path: where to save the decision and its measurements (JSON,
            readable back as ``profile``).
        measure_iters, measure_threads: pte_runner iterations and threads
            for ``profile="measure"``.
        candidates: take only these candidates (keys from
            :func:`rustconv.guided.candidate_keys`); used by the measurements.
        stateful: the model's mutated buffers that feed a partition become
            state the delegate owns (see above); False keeps them delegate
            inputs with their ``copy_`` outside.

    Works with both lowering flows::

        to_edge(ep).to_backend(RustConvPartitioner())
        to_edge_transform_and_lower(ep, partitioner=[RustConvPartitioner(), ...])
    """

    def __init__(
        self,
        compile_specs: list[CompileSpec] | None = None,
        *,
        profile: str | Path | dict | None = None,
        rest: list[Partitioner] | None = None,
        decision_path: str | Path | None = None,
        measure_iters: int = 10,
        measure_threads: int | None = None,
        candidates: set[str] | None = None,
        program: ExportedProgram | None = None,
        stateful: bool = True,
    ) -> None:
        super().__init__()
        self.stateful = stateful
        self.compile_specs = list(compile_specs or [])
        self.delegation_spec = DelegationSpec(
            RustConvBackend.__name__, validate_compile_specs(self.compile_specs)
        )
        self.profile = profile
        self.rest = list(rest or [])
        self.decision_path = decision_path
        self.measure = {"iters": measure_iters, "threads": measure_threads}
        self.candidates = candidates
        self.program = program
        if profile == "measure" and program is None:
            raise ValueError(
                'profile="measure" lowers variants of the exported program: pass it as '
                "program=, or use rustconv.guided.lower_guided"
            )
        #: The last profile-guided decision (rustconv.guided.Decision).
        self.decision = None
        #: The candidates of the last partitioned program, in execution order.
        self.last_candidates: list[str] = []

    def _chosen(self, exported_program: ExportedProgram) -> set[str] | None:
        """The candidates to take, when the choice is not "all of them"."""
        if self.candidates is not None:
            return self.candidates
        if self.profile is None:
            return None
        from rustconv import guided

        if self.profile == "measure":
            decision = guided.measure(self.program, self.compile_specs, self.rest, **self.measure)
            self.profile = decision.to_json()  # measured once, even if called again
            if decision.keys != guided.candidate_keys(exported_program):
                raise ValueError("the measured candidates differ from this program's")
        else:
            decision = guided.load_profile(self.profile, guided.candidate_keys(exported_program))
        print(decision.format())
        if self.decision_path is not None:
            guided.save(decision, self.decision_path)
        self.decision = decision
        return decision.delegated()

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        proposal = propose(exported_program)
        _log_rejections(proposal)
        from rustconv.guided import candidate_keys

        self.last_candidates = candidate_keys(exported_program)
        chosen = self._chosen(exported_program)
        partition_tags: dict[str, DelegationSpec] = {}
        for partition in proposal.partitions:
            if chosen is not None and partition_key(partition.nodes) not in chosen:
                continue
            tag = f"{TAG_PREFIX}{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            partition_tags[tag] = self.delegation_spec

        # Constant weights/biases used only by our nodes become delegate-owned.
        # (tag_constant_data skips mutated buffers.)
        tag_constant_data(exported_program)
        if self.stateful:
            _tag_state(exported_program, partition_tags)
        else:
            _untag_mutated_buffers(exported_program, partition_tags)
        return PartitionResult(
            tagged_exported_program=exported_program, partition_tags=partition_tags
        )

    def explain(self, exported_program: ExportedProgram) -> dict[str, str]:
        """For every ``call_function`` node not taken: its name -> why not.

        Runs the same grouping as :meth:`partition` without tagging anything,
        so it can be called on the edge program before ``to_backend``. Reasons
        name the op ("aten.mm.default is not a RustConv op"), a dtype, a view
        the blob cannot express, a boundary rule, or "elementwise island
        without a conv or scan".
        """
        proposal = propose(exported_program)
        return {node.name: reason for node, reason in proposal.rejected.items()}

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool] | None]:
        """Keeps ``aten.conv1d`` and ``aten.softplus`` whole where they will be delegated.

        Without this, ``aten.conv1d`` (a CompositeImplicitAutograd op) is
        decomposed to ``aten.convolution``, ``padding="same"`` with an even
        kernel extent additionally to a ``constant_pad_nd``, and softplus to
        ``where(x > 20, x, log1p(exp(x)))`` (which RustConv also handles, in
        four nodes instead of one).

        ExecuTorch raises after lowering if a preserved node is left
        undelegated, and has no portable kernel for softplus, so the filter
        keeps a node only if this partitioner will take it: it runs the same
        grouping (:mod:`rustconv.partition_proposal`) on the program it is
        given, which at that point is decomposed except for these ops. After
        lowering, ExecuTorch calls it again on the lowered program to check
        that nothing preserved was left behind; there an edge-dialect node of
        ours that is still supported on its own is reported, so a prediction
        that failed is an error at export rather than a missing kernel at run
        time.

        ExecuTorch 1.5.1 runs one decomposition pass per partitioner, each
        sparing only that partitioner's own ops. With another partitioner in
        the list (in either order) its pass decomposes conv1d and softplus
        anyway, so the partitioner then sees ``aten.convolution`` (plus a pad
        for even "same") and the decomposed softplus, which it handles too;
        and our pass likewise decomposes the other partitioner's preserved ops
        (XNNPACK's ``aten.linear``).
        """
        if self.profile is not None or self.candidates is not None:
            # Candidates may be left out: keeping an op whole that nothing then
            # takes is an error, and the decomposed forms are all supported.
            return [], None
        claimed: dict[int, set[Node]] = {}  # per graph, computed on first use

        def context(node: Node) -> GraphContext:
            return GraphContext(ep if node.graph is ep.graph else None)

        def keep(node: Node) -> bool:
            if aten_op(node) not in _KEEP_WHOLE:
                return False
            if node.target is not aten_op(node):
                # An edge op: the post-lowering check on the lowered program.
                lowering = lowering_for(node)
                return (
                    lowering is not None
                    and lowering.unsupported_reason(node, context(node)) is None
                )
            key = id(node.graph)
            if key not in claimed:
                module = node.graph.owning_module
                claimed[key] = propose_graph(module, context(node)).taken()
            return node in claimed[key]

        return list(_KEEP_WHOLE), keep


def _log_rejections(proposal: Proposal) -> None:
    for node, reason in proposal.rejected.items():
        if lowering_for(node) is not None:
            # Only our own op kinds: "aten.mm is not a RustConv op" is noise.
            logger.info("RustConv does not take %s: %s", node.name, reason)


def _tag_state(ep: ExportedProgram, tags: dict[str, DelegationSpec]) -> None:
    """Mutated buffers read by one of our partitions become delegate-owned.

    ``tag_mutated_buffer`` gives a buffer the tag of a partition reading it.
    A buffer also read outside that partition, or whose new value is
    computed outside it, stays a delegate input (others would read a stale
    copy; the delegate could not update it).
    """
    ctx = GraphContext(ep)
    sig = ep.graph_signature
    # buffer target -> the node computing its new value
    new_value = {
        spec.target: spec.arg.name
        for spec in sig.output_specs
        if spec.kind == OutputKind.BUFFER_MUTATION
    }
    nodes = {node.name: node for node in ep.graph.nodes}
    for node in ep.graph.nodes:
        if ctx.is_mutable_buffer(node):
            source = nodes.get(new_value.get(sig.inputs_to_buffers.get(node.name), ""))
            _follow_state(node, source, tags)
    tag_mutated_buffer(ep)
    for node in ep.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if not ctx.is_mutable_buffer(node) or tag not in tags:
            continue
        source = nodes.get(new_value.get(sig.inputs_to_buffers.get(node.name), ""))
        shared = any(user.meta.get("delegation_tag") != tag for user in node.users)
        # The new value must be computed by the same delegate: it updates
        # the state in place at the end of its call.
        if shared or source is None or source.meta.get("delegation_tag") != tag:
            del node.meta["delegation_tag"]


def _follow_state(buffer: Node, source: Node | None, tags: dict[str, DelegationSpec]) -> None:
    """Moves the node computing a state's new value into the partition reading
    the state, where it can be.

    torch.fx's grouping may put a node that only feeds the program's output
    (``conv_state``'s new value, a slice of the partition's ``cat``) in
    another RustConv partition. Moving such a sink costs nothing and cannot
    make a cycle: nothing reads it but the output, and what it reads is in
    the partition it joins (or outside every partition).
    """
    users = {user.meta.get("delegation_tag") for user in buffer.users}
    if source is None or len(users) != 1:
        return
    (tag,) = users
    if tag not in tags or source.meta.get("delegation_tag") not in tags:
        return
    if any(user.op != "output" for user in source.users):
        return
    if all(n.meta.get("delegation_tag") in (tag, None) for n in source.all_input_nodes):
        source.meta["delegation_tag"] = tag


def _untag_mutated_buffers(ep: ExportedProgram, tags: dict[str, DelegationSpec]) -> None:
    """The delegate does not own mutable state: a mutated buffer stays an input."""
    ctx = GraphContext(ep)
    for node in ep.graph.nodes:
        if ctx.is_mutable_buffer(node) and node.meta.get("delegation_tag") in tags:
            del node.meta["delegation_tag"]
