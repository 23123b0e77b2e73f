"""``RustConvPartitioner``: tags the nodes the RustConv runtime can execute.

Partitions grow from every supported 1-D convolution and
``rustconv.linear_scan`` across the ops around them (elementwise math, gates,
pads, slices, transposes, chunks, concatenations; see
:mod:`rustconv.export.ops_lowering` for the list), so that a whole block becomes one
``RustConvBackend`` delegate call whose blob records how the runtime fuses it
(:mod:`rustconv.export.fusion`). Linears, matmuls and anything else are left to the
next partitioner, and so are quantized ops (a node reading a ``dequantize``,
:mod:`rustconv.export.ops_lowering.quantized`). The grouping rules are in
:mod:`rustconv.export.partition_proposal`; :meth:`RustConvPartitioner.explain` says why
each node was not taken.

Whatever computes a conv's weight or bias from constants (views, casts, weight
normalization) is taken with the conv and evaluated at export
(:mod:`rustconv.export.ops_lowering.folding`); BatchNorm in eval mode becomes
constants (:mod:`rustconv.export.ops_lowering.batch_norm`).

In a list with other partitioners, RustConv changes nothing of what they see
or produce: with ``to_edge_transform_and_lower`` its decomposition pass is then
the identity (see :meth:`RustConvPartitioner.ops_to_not_decompose`), and the
nodes outside its own calls end up where they would without it
(:func:`rustconv.devtools.testing.check_others_unchanged` checks a model).

Weights and biases that are constants (parameters, buffers, lifted tensors)
are tagged with ``tag_constant_data`` so the delegate owns them: they go into
the blob's constant segment. A weight that is a graph input, or is computed by
ops outside the delegate, stays a regular delegate input. A mutated buffer
that feeds a partition (a convolution's ``conv_state`` updated with ``copy_``,
a scan's initial state) is tagged with ExecuTorch's ``tag_mutated_buffer``, as
its CoreML, MLX and Vulkan partitioners do: the delegate owns it (see
:mod:`rustconv.export.lowering`), keeps it across calls and updates it in place, and
ExecuTorch drops its ``copy_`` back. ``stateful=False`` keeps the previous
behaviour (the buffer a delegate input, its new value a delegate output).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

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

from rustconv.backend_id import BACKEND_ID
from rustconv.compile_specs import validate_compile_specs
from rustconv.export.lowering_call import current_call
from rustconv.export.ops_lowering import GraphContext, aten_op, lowering_for
from rustconv.export.partition_proposal import (
    Proposal,
    candidate_keys,
    partition_key,
    propose,
    propose_graph,
)

__all__ = ["RustConvPartitioner", "TAG_PREFIX", "MOVED_TO_GUIDED"]

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
        stateful: the model's mutated buffers that feed a partition become
            state the delegate owns (see above); False keeps them delegate
            inputs with their ``copy_`` outside.

    Profile-guided partitioning (take a candidate only where it is faster) is
    :class:`rustconv.guided.GuidedPartitioner`, this class with a choice of
    candidates on top; the arguments it takes (``profile``, ``rest``,
    ``decision_path``, ``measure_iters``, ``measure_threads``, ``candidates``,
    ``program``) were this constructor's before, and are refused here with a
    ``TypeError`` saying so.

    Works with both lowering flows::

        to_edge(ep).to_backend(RustConvPartitioner())
        to_edge_transform_and_lower(ep, partitioner=[RustConvPartitioner(), ...])
    """

    def __init__(
        self,
        compile_specs: list[CompileSpec] | None = None,
        *,
        stateful: bool = True,
        **moved: object,
    ) -> None:
        if moved:
            _refuse_moved_arguments(moved)
        super().__init__()
        self.stateful = stateful
        self.compile_specs = list(compile_specs or [])
        self.delegation_spec = DelegationSpec(
            BACKEND_ID, validate_compile_specs(self.compile_specs)
        )
        #: The candidates of the last partitioned program, in execution order.
        self.last_candidates: list[str] = []

    def _chosen(self, exported_program: ExportedProgram) -> set[str] | None:
        """The candidates to take, when the choice is not "all of them"
        (a subclass's policy: :class:`rustconv.guided.GuidedPartitioner`)."""
        return None

    def _may_leave_out(self) -> bool:
        """Whether :meth:`_chosen` may leave candidates out; then nothing is
        kept from decomposition (a candidate left out must run elsewhere)."""
        return False

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        proposal = propose(exported_program)
        _log_rejections(proposal)
        self.last_candidates = candidate_keys(exported_program, proposal)
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
        """What ``to_edge_transform_and_lower`` keeps from decomposition for us.

        ExecuTorch 1.5.1 runs one decomposition pass per partitioner of the
        list, and each pass decomposes every op of the default table that its
        own partitioner did not ask to keep, including the ops the other
        partitioners asked to keep (XNNPACK's ``aten.linear``), whatever the
        order. So the answer depends on the list (read by
        :func:`rustconv.export.lowering_call.current_call`; called from anywhere
        else, this raises :class:`rustconv.export.lowering_call.UnknownCaller`):

        * **With other partitioners** our pass is the identity: it keeps every
          op of the graph that the default table would decompose, with no
          filter, so ExecuTorch skips it, and the other partitioners' passes
          alone decide what the program looks like; ours sees the result, as
          it would with ``to_edge``, and takes ``aten.convolution`` and the
          decomposed ops. After lowering it checks nothing (the others check
          their own ops). The program the others partition is then exactly
          the one they get without RustConv (rule one of issue 16;
          :mod:`rustconv.devtools.testing` checks it).
        * **Alone**, our pass is the only one: it keeps ``aten.conv1d`` and
          ``aten.softplus`` whole where this partitioner will take them (else
          conv1d is decomposed to ``aten.convolution``, ``padding="same"``
          with an even kernel extent also to a ``constant_pad_nd``, and
          softplus to ``where(x > 20, x, log1p(exp(x)))``, four nodes RustConv
          also handles). ExecuTorch raises after lowering if a kept node is
          left undelegated, and has no portable kernel for softplus, so the
          filter keeps a node only if the grouping
          (:mod:`rustconv.export.partition_proposal`), run on the program it is given,
          takes it. After lowering, ExecuTorch calls it again on the lowered
          program to check that nothing kept was left behind; there an
          edge-dialect node of ours still supported on its own is reported, so
          a prediction that failed is an error at export, not a missing kernel
          at run time. When candidates may be left out (profile-guided
          partitioning, :meth:`_may_leave_out`) nothing is kept (the
          decomposed forms are all supported).
        """
        call = current_call(self)
        if any(not isinstance(p, RustConvPartitioner) for p in call.partitioners):
            if call.phase == "check":
                return [], _nothing
            return _ops_the_default_table_decomposes(ep), None
        if self._may_leave_out():
            return [], None
        return self._keep_where_taken(ep)

    def _keep_where_taken(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[Node], bool]]:
        """The answer when this partitioner is alone (see ops_to_not_decompose)."""
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


#: What ``RustConvPartitioner(...)`` took before profile-guided partitioning
#: moved to :class:`rustconv.guided.GuidedPartitioner`.
MOVED_TO_GUIDED = (
    "profile",
    "rest",
    "decision_path",
    "measure_iters",
    "measure_threads",
    "candidates",
    "program",
)


def _refuse_moved_arguments(moved: dict[str, object]) -> None:
    unknown = sorted(set(moved) - set(MOVED_TO_GUIDED))
    if unknown:
        raise TypeError(f"RustConvPartitioner() got unexpected keyword argument(s) {unknown}")
    names = ", ".join(f"{name}=" for name in moved)
    raise TypeError(
        f"RustConvPartitioner({names}...): profile-guided partitioning moved to "
        "rustconv.guided.GuidedPartitioner, which takes the same arguments "
        "(from rustconv.guided import GuidedPartitioner; "
        f"GuidedPartitioner(compile_specs, {names}...))"
    )


def _nothing(node: Node) -> bool:
    return False


def _ops_the_default_table_decomposes(ep: ExportedProgram) -> list[torch._ops.OpOverload]:
    """Every op of ``ep`` (control flow included) that ExecuTorch's default
    decomposition table has an entry for: keeping them all makes our pass a no-op."""
    from executorch.exir.graph_module import get_control_flow_submodules

    table = _default_table_ops()
    found: dict[torch._ops.OpOverload, None] = {}
    modules = [ep.graph_module]
    while modules:
        module = modules.pop()
        for node in module.graph.nodes:
            op = aten_op(node)
            if op is not None and op in table:
                found[op] = None
        modules.extend(sub for _, sub, _ in get_control_flow_submodules(module))
    return list(found)


def _default_table_ops() -> frozenset[torch._ops.OpOverload]:
    """The ops ExecuTorch's default decomposition table has an entry for.

    Listing them materializes the table (its composite ops come from every
    registered operator): 0.12 s, once per lowering. The answer changes only
    when an operator or a composite kernel is registered or dropped (a
    custom-op library loaded or unloaded; ExecuTorch's quant fusion patterns,
    built when the LLM recipes' export runs, register composite kernels for
    ``quantized_decomposed.add`` and ``add_relu``, defined when ``exir`` was
    imported), so it is kept per set of both, which the dispatcher lists in
    about 5 ms. A count of operators is not enough: a kernel registered for an
    existing op, or one library dropped and another as large loaded, keeps
    the count."""
    return _table_ops_for(
        frozenset(torch._C._dispatch_get_all_op_names()),
        frozenset(
            torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
        ),
    )


@functools.lru_cache(maxsize=4)
def _table_ops_for(
    operators: frozenset[str], composite: frozenset[str]
) -> frozenset[torch._ops.OpOverload]:
    """:func:`_default_table_ops` for these registrations (the arguments are
    the cache's key)."""
    del operators, composite
    from executorch.exir.program._program import _default_decomposition_table

    return frozenset(_default_decomposition_table().keys())


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
