"""Which supported nodes form which RustConv partitions, and why others do not.

Partitions grow from convolutions and linear scans across every op kind the
registry supports; torch.fx's ``CapabilityBasedPartitioner`` groups connected
supported nodes and guarantees acyclic partitions. On top of that, a
partition must respect what the delegate boundary can carry; a violation
excludes the offending node and the grouping is redone, until none is left
(each round excludes at least one more node, so this ends):

* a node producing nothing the delegate could return (a pad folded into its
  convolution, a split, a SymInt, a scalar constant, a comparison's mask) is
  taken only together with all of its users;
* a node is taken only if each input it reads from outside is a tensor the
  delegate can receive (a supported float dtype, or a constant);
* a convolution's weight and bias are constants or delegate inputs (the
  runtime prepares them at load; the rule is
  :func:`rustconv.export.ops_lowering.registry.computed_inside_reason`), so their
  producer is not taken, unless it computes a constant
  (:mod:`rustconv.export.ops_lowering.folding`: a view, cast or weight normalization
  of parameters), which ``preprocess`` evaluates;
* a node computing a constant is taken only together with all of its users
  and with the constant-computing nodes it reads: its result never leaves
  the delegate, and must be computable from delegate-owned constants alone.

Partitions grow along data dependencies only (``skip_horizontal_fusion``):
torch.fx would otherwise merge unrelated supported nodes, e.g. the transpose
of a linear's weight, into a convolution's partition, taking it away from
the backend that runs the linear.

A partition with no convolution or scan (an elementwise island) is not
delegated: RustConv's point is fusing work around those anchors, and a lone
``add`` is better left to the next partitioner. Independent anchored
partitions are then merged where that creates no cycle, so a block with
parallel branches is still one delegate call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase

from rustconv.export.ops_lowering import SUPPORTED_DTYPES, GraphContext, lowering_for, reason_for
from rustconv.export.ops_lowering.folding import computes_constant, constant_reason
from rustconv.export.ops_lowering.registry import computed_inside_reason, is_anchor

__all__ = [
    "ISLAND_REASON",
    "Proposal",
    "candidate_keys",
    "partition_key",
    "propose",
    "propose_graph",
]

ISLAND_REASON = "elementwise island without a conv or scan"
CONSTANT_REASON = "computes a constant that no RustConv partition reads"


@dataclass
class Proposal:
    """Partitions worth delegating, and every other ``call_function`` node with its reason."""

    partitions: list[Partition]
    rejected: dict[Node, str] = field(default_factory=dict)

    def taken(self) -> set[Node]:
        return {node for p in self.partitions for node in p.nodes}


class _Support(OperatorSupportBase):
    def __init__(self, allowed: set[Node]) -> None:
        super().__init__()
        self._allowed = allowed

    def is_node_supported(self, submodules, node: Node) -> bool:
        return node in self._allowed


def partition_key(nodes) -> str:
    """A candidate's identity across exports of one model: its nodes' names."""
    return ",".join(sorted(n.name for n in nodes))


def propose(ep: ExportedProgram) -> Proposal:
    """Runs the grouping described in the module docstring on ``ep``."""
    return propose_graph(ep.graph_module, GraphContext(ep))


def propose_graph(graph_module: GraphModule, ctx: GraphContext) -> Proposal:
    """:func:`propose` on a graph, with ``ctx`` telling its constants apart."""
    calls = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    base = {n: None if computes_constant(n, ctx) else reason_for(n, ctx) for n in calls}
    excluded: dict[Node, str] = {}
    while True:
        allowed = {n for n in calls if base[n] is None and n not in excluded}
        partitions = _group(graph_module, allowed, horizontal=False)
        violations = {n: r for n, r in _violations(partitions, ctx).items() if n not in excluded}
        if not violations:
            break
        excluded.update(violations)

    kept, islands = [], []
    for partition in partitions:
        anchored = any(is_anchor(n) for n in partition.nodes)
        (kept if anchored else islands).append(partition)
    in_island = {n for p in islands for n in p.nodes}
    kept = _merge_independent(graph_module, kept, ctx)
    taken = {n for p in kept for n in p.nodes}
    rejected = {}
    for n in calls:
        if n in taken:
            continue
        if base[n] is not None:
            rejected[n] = base[n] + _why_not_evaluated(n, ctx)
        elif n in excluded:
            rejected[n] = excluded[n]
        elif computes_constant(n, ctx):
            rejected[n] = CONSTANT_REASON
        elif n in in_island:
            rejected[n] = ISLAND_REASON
        else:
            rejected[n] = "not grouped with a conv or scan"
    return Proposal(partitions=kept, rejected=rejected)


def _group(graph_module: GraphModule, allowed: set[Node], horizontal: bool) -> list[Partition]:
    return CapabilityBasedPartitioner(
        graph_module,
        _Support(allowed),
        allows_single_node_partition=True,
        skip_horizontal_fusion=not horizontal,
    ).propose_partitions()


def _merge_independent(
    graph_module: GraphModule, partitions: list[Partition], ctx: GraphContext
) -> list[Partition]:
    """The anchored partitions, merged where acyclic (one delegate call for a
    block with parallel branches); unchanged if merging would break a rule."""
    if len(partitions) < 2:
        return partitions
    merged = _group(graph_module, {n for p in partitions for n in p.nodes}, horizontal=True)
    if _violations(merged, ctx) or not all(any(is_anchor(n) for n in p.nodes) for p in merged):
        return partitions
    return merged


def _can_cross(node: Node, ctx: GraphContext) -> bool:
    """Whether ``node``'s result can be handed to the delegate from outside."""
    if ctx.is_constant(node):
        return True  # becomes delegate-owned data (tag_constant_data)
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype in SUPPORTED_DTYPES


def _describe(node: Node) -> str:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return f"a {val.dtype} tensor"
    return f"a {type(val).__name__}"


def _violations(partitions: list[Partition], ctx: GraphContext) -> dict[Node, str]:
    owner = {node: p.id for p in partitions for node in p.nodes}
    violations: dict[Node, str] = {}
    for partition in partitions:
        for node in partition.nodes:
            here = owner[node]
            if computes_constant(node, ctx):
                _constant_violation(node, here, owner, ctx, violations)
                continue
            lowering = lowering_for(node)
            assert lowering is not None
            if lowering.inline_only(node, ctx):
                outside = [u for u in node.users if owner.get(u) != here]
                if outside:
                    violations[node] = (
                        f"its result ({lowering.kind}) cannot leave the delegate, but "
                        f"{outside[0].name} outside reads it"
                    )
            for source in node.all_input_nodes:
                if owner.get(source) != here and not _can_cross(source, ctx):
                    violations.setdefault(
                        node,
                        f"it reads {source.name} ({_describe(source)}) from outside the "
                        "delegate, which cannot be a delegate input",
                    )
            for operand in lowering.export_operands(node):
                inside = owner.get(operand) == here and computes_constant(operand, ctx)
                if not (ctx.is_constant(operand) or inside):
                    violations.setdefault(
                        node,
                        f"it needs {operand.name} at export (to fold it into constants), but "
                        f"{operand.name} is computed outside the delegate",
                    )
            for operand in lowering.outside_operands(node):
                if not isinstance(operand, Node):
                    continue
                inside = owner.get(operand) == here and not computes_constant(operand, ctx)
                reason = computed_inside_reason(operand, node, inside)
                if reason is not None:
                    violations.setdefault(operand, reason)
    return violations


def _why_not_evaluated(node: Node, ctx: GraphContext) -> str:
    """For a node reading only constants: why it is not evaluated at export either."""
    sources = node.all_input_nodes
    if not sources or not all(ctx.is_constant(s) or computes_constant(s, ctx) for s in sources):
        return ""
    reason = constant_reason(node, ctx)
    return (
        ""
        if reason is None
        else f"; it reads only constants but is not evaluated at export: {reason}"
    )


def _constant_violation(
    node: Node, here: int, owner: dict[Node, int], ctx: GraphContext, violations: dict[Node, str]
) -> None:
    """A constant-computing node: all its users and constant-computing inputs here."""
    outside = [u for u in node.users if owner.get(u) != here]
    if outside:
        violations[node] = (
            f"it computes a constant that {outside[0].name} outside the delegate also reads "
            "(left outside; its result is a delegate input)"
        )
        return
    for source in node.all_input_nodes:
        if computes_constant(source, ctx) and owner.get(source) != here:
            violations[node] = (
                f"it reads the constant computed by {source.name} outside the delegate"
            )
            return


def candidate_keys(ep: ExportedProgram, proposal: Proposal | None = None) -> list[str]:
    """The partitions of ``ep`` (``proposal``, else proposed here) in execution
    order, each named by its nodes (:func:`partition_key`): the candidates of
    profile-guided partitioning (:mod:`rustconv.guided`), and
    :attr:`RustConvPartitioner.last_candidates`."""
    proposal = proposal if proposal is not None else propose(ep)
    position = {node: i for i, node in enumerate(ep.graph.nodes)}
    partitions = sorted(proposal.partitions, key=lambda p: min(position[n] for n in p.nodes))
    return [partition_key(p.nodes) for p in partitions]
