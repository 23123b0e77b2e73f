"""Grouping the blob's nodes into fused kernels (``Node.kernel``).

The rules a grouping must follow are in ``schema/README.md`` ("Fused
kernels"); the runtime checks them. This module decides the grouping at
export, so a fused kernel has one identity from the debug-handle map to the
runtime's plan and its profiling events:

1. **Anchors.** Every ``Conv1d`` and ``LinearScan`` starts a kernel.
2. **Epilogues** grow forward from the anchor's output over elementwise nodes
   with the anchor output's shape, one closed region at a time: the readers
   of the current result (and, if needed, the readers of what they produce,
   up to a small limit) join when every value they produce except one is read
   only among them; that one becomes the new result. ``y * sigmoid(y)`` thus
   joins whole, while a result also read by another op stops the growth.
   A mask (a comparison's result) is never the result. Then a chain of
   ``Permute``/``Reshape`` read only by each other may follow (not a
   ``Reshape`` that splits or merges dimensions: see 4).
3. **Everything else** is placed where it is read, in reverse topological
   order: a node read only by one kernel joins it (the anchor's prologue, an
   epilogue's side operand, or a pass kernel's expression); a node read by
   several kernels is duplicated into each of them, with a private output
   per copy (recomputing an elementwise or view op is cheaper than a round
   trip through memory); a node whose result must be materialised (a delegate
   output, or a convolution weight) gets a pass kernel of its own. Anchors are
   never duplicated.

4. **Regroups.** A ``Reshape`` that splits or merges dimensions
   (:func:`rustconv.export.ir.regroups`, a transposed convolution's phases
   interleaved) is no view the runtime reads through: it copies its stored
   input, so it is a kernel of its own, and what it reads is materialised.

A ``Reduce`` is neither elementwise nor an anchor, so no epilogue grows over
it: a normalisation of an anchor's output lands, with the elementwise nodes
applying it, in the kernel that reads it (the next conv's prologue, or a
pass), whose statistics pass gathers it before that kernel's loops.

Why no cycle can arise between kernels: every kernel has exactly one
materialised result, and every node in a kernel contributes to that result
(prologue nodes feed the anchor, side operands feed the epilogue, pass kernel
nodes feed its result). If kernel Y reads X's result, the original graph has
a path from X's result to Y's; a cycle between kernels would be a cycle in the
original graph. :func:`assign_kernels` still verifies the grouping and falls
back to one kernel per node if a check fails, logging why.

With fusion disabled (compile spec ``fusion``: 0) every node is its own
kernel and the order is unchanged.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from dataclasses import dataclass, field

from rustconv.errors import UnsupportedGraphError
from rustconv.export.ir import ELEMENTWISE_OPS, EPILOGUE_VIEW_OPS, IRGraph, IRNode, IRValue
from rustconv.export.ops_lowering.common import same_expr
from rustconv.fb.Op import Op
from rustconv.fb.ValueKind import ValueKind

__all__ = ["assign_kernels", "check_kernels", "EPILOGUE_SEARCH_LIMIT"]

logger = logging.getLogger(__name__)

#: Most nodes one epilogue step may examine while closing a region.
EPILOGUE_SEARCH_LIMIT = 16


def assign_kernels(graph: IRGraph, enabled: bool = True) -> IRGraph:
    """Returns ``graph`` with ``kernel`` set on every node, ordered by kernel.

    Fusion may duplicate nodes (adding values) and reorder them; the result is
    a new node list over the same values list.
    """
    if not enabled:
        return _unfused(graph)
    fused = _Fuser(graph).run()
    problem = check_kernels(fused)
    if problem is not None:
        logger.warning("RustConv fusion fell back to one kernel per node: %s", problem)
        return _unfused(graph)
    return fused


def _unfused(graph: IRGraph) -> IRGraph:
    nodes = [node.remapped({}) for node in graph.nodes]
    for index, node in enumerate(nodes):
        node.kernel = index
    return IRGraph(graph.values, nodes, graph.inputs, graph.outputs)


@dataclass
class _Kernel:
    """A kernel under construction: its nodes keyed by their original node."""

    anchor: IRNode | None
    result: int = -1
    nodes: dict[int, IRNode] = field(default_factory=dict)  # id(original) -> placed node
    renamed: dict[int, int] = field(default_factory=dict)  # original value -> private copy


class _Fuser:
    def __init__(self, graph: IRGraph) -> None:
        self.graph = graph
        self.position = {id(node): i for i, node in enumerate(graph.nodes)}
        self.producer = graph.producers()
        self.readers = graph.readers()
        self.outputs = set(graph.outputs) | set(graph.state_updates())
        self.kernels: list[_Kernel] = []
        # id(original node) -> kernels it was placed in
        self.placed: dict[int, list[_Kernel]] = {}

    # -- driver -------------------------------------------------------------

    def run(self) -> IRGraph:
        for node in self.graph.nodes:
            if node.is_anchor:
                self._anchor_kernel(node)
        for node in reversed(self.graph.nodes):
            if id(node) not in self.placed:
                self._place(node)
        for kernel in self.kernels:
            for key, placed in kernel.nodes.items():
                kernel.nodes[key] = placed.remapped(kernel.renamed)
        return self._ordered()

    def _put(self, kernel: _Kernel, original: IRNode, placed: IRNode | None = None) -> None:
        kernel.nodes[id(original)] = placed or original
        self.placed.setdefault(id(original), []).append(kernel)

    # -- anchors and epilogues -----------------------------------------------

    def _anchor_kernel(self, anchor: IRNode) -> None:
        kernel = _Kernel(anchor=anchor)
        self.kernels.append(kernel)
        self._put(kernel, anchor)
        shape = self.graph.values[anchor.output].shape
        result = anchor.output
        while True:
            region = self._epilogue_step(result, shape)
            if region is None:
                break
            members, result = region
            for member in sorted(members, key=lambda n: self.position[id(n)]):
                self._put(kernel, member)
        while result not in self.outputs:
            readers = self.readers.get(result, [])
            if len(readers) != 1:
                break
            (view,) = readers
            if (
                view.op_type not in EPILOGUE_VIEW_OPS
                or view.regroups(self.graph.values)
                or id(view) in self.placed
            ):
                break
            self._put(kernel, view)
            result = view.output
        kernel.result = result

    def _eligible(self, node: IRNode, shape: tuple) -> bool:
        if node.op_type not in ELEMENTWISE_OPS or id(node) in self.placed:
            return False
        out = self.graph.values[node.output].shape
        return len(out) == len(shape) and all(map(same_expr, out, shape))

    def _epilogue_step(self, start: int, shape: tuple) -> tuple[list[IRNode], int] | None:
        """The smallest closed region of eligible nodes after ``start``, and its result.

        Every reader of ``start`` must join (else ``start`` would stay
        materialised); then eligible readers of the region's open values
        join until exactly one value, not a mask, is read outside it.
        """
        if start in self.outputs:
            return None
        first = self.readers.get(start, [])
        if not first or not all(self._eligible(n, shape) for n in first):
            return None
        members = {id(n): n for n in first}
        while True:
            open_values = [
                n.output
                for n in members.values()
                if n.output in self.outputs
                or any(id(r) not in members for r in self.readers.get(n.output, []))
            ]
            if len(open_values) == 1 and not self.graph.values[open_values[0]].is_mask:
                return list(members.values()), open_values[0]
            new = {
                id(r): r
                for value in open_values
                for r in self.readers.get(value, [])
                if id(r) not in members and self._eligible(r, shape)
            }
            if not new or len(members) + len(new) > EPILOGUE_SEARCH_LIMIT:
                return None
            members.update(new)

    # -- everything else ------------------------------------------------------

    def _place(self, node: IRNode) -> None:
        value = node.output
        consumers: dict[int, _Kernel] = {}
        materialise = value in self.outputs or node.regroups(self.graph.values)
        for reader in self.readers.get(value, []):
            if self._reads_from_outside(reader, value) or reader.regroups(self.graph.values):
                materialise = True
                continue
            for kernel in self.placed.get(id(reader), []):
                consumers[id(kernel)] = kernel
        if materialise or not consumers:
            kernel = _Kernel(anchor=None, result=value)
            self.kernels.append(kernel)
            self._put(kernel, node)
        elif len(consumers) == 1:
            (kernel,) = consumers.values()
            self._put(kernel, node)
        else:
            for kernel in consumers.values():
                copy = self.graph.add_value(_private_copy(self.graph.values[value]))
                kernel.renamed[value] = copy
                self._put(kernel, node, node.remapped({}, output=copy))

    @staticmethod
    def _reads_from_outside(reader: IRNode, value: int) -> bool:
        return any(getattr(reader.op, name) == value for name in reader.outside_fields)

    # -- order ----------------------------------------------------------------

    def _ordered(self) -> IRGraph:
        """Kernels in a topological order (ties: where their result was), numbered."""
        produced_in: dict[int, int] = {}
        for k, kernel in enumerate(self.kernels):
            for placed in kernel.nodes.values():
                produced_in[placed.output] = k
        depends: list[set[int]] = [set() for _ in self.kernels]
        for k, kernel in enumerate(self.kernels):
            for placed in kernel.nodes.values():
                for ref in placed.operands():
                    source = produced_in.get(ref)
                    if source is not None and source != k:
                        depends[k].add(source)
        users: list[list[int]] = [[] for _ in self.kernels]
        for k, sources in enumerate(depends):
            for source in sources:
                users[source].append(k)

        def rank(k: int) -> int:
            result = self.producer.get(self.kernels[k].result)
            return self.position[id(result)] if result is not None else -1

        pending = [len(d) for d in depends]
        ready = [(rank(k), k) for k, n in enumerate(pending) if n == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            _, k = heapq.heappop(ready)
            order.append(k)
            for user in users[k]:
                pending[user] -= 1
                if pending[user] == 0:
                    heapq.heappush(ready, (rank(user), user))
        if len(order) != len(self.kernels):
            raise UnsupportedGraphError("internal: fused kernels depend on each other in a cycle")

        nodes: list[IRNode] = []
        for index, k in enumerate(order):
            kernel = self.kernels[k]
            placed_nodes = sorted(kernel.nodes.items(), key=lambda item: self._pos(item[0]))
            for _, placed in placed_nodes:
                placed.kernel = index
                nodes.append(placed)
            for original, copy in kernel.renamed.items():
                self.graph.values[copy].name = f"{self.graph.values[original].name}@k{index}"
        return IRGraph(self.graph.values, nodes, self.graph.inputs, self.graph.outputs)

    def _pos(self, key: int) -> int:
        return self.position[key]


def _private_copy(value: IRValue) -> IRValue:
    return IRValue(
        name=value.name,
        dtype=value.dtype,
        shape=value.shape,
        dims=list(value.dims),
        kind=ValueKind.Intermediate,
        is_mask=value.is_mask,
    )


def check_kernels(graph: IRGraph) -> str | None:
    """``None`` if ``graph``'s grouping follows schema/README.md, else the first problem.

    Checks what the runtime will: consecutive kernels numbered from 0, a
    topological node order, at most one anchor per kernel, exactly one
    materialised result per anchor kernel besides its reductions', conv
    weights materialised, no mask materialised, no reduction of its own
    kernel's anchor, and every regroup alone in its kernel.
    """
    values = graph.values
    sizes = Counter(node.kernel for node in graph.nodes)
    producers = graph.producers()
    kernel_of: dict[int, int] = {}
    available = {v for v in graph.inputs}
    available.update(
        i for i, v in enumerate(values) if v.kind in (ValueKind.Constant, ValueKind.State)
    )
    previous = -1
    anchors: dict[int, int] = {}
    for position, node in enumerate(graph.nodes):
        if node.kernel not in (previous, previous + 1) or (position == 0 and node.kernel != 0):
            return (
                f"node {position} ({node.name}) has kernel {node.kernel} after kernel "
                f"{previous}; kernels must be consecutive and numbered from 0"
            )
        previous = node.kernel
        for ref in node.operands():
            if ref not in available:
                return f"node {position} ({node.name}) reads value {ref} before it is computed"
        available.add(node.output)
        kernel_of[node.output] = node.kernel
        if node.is_anchor:
            if node.kernel in anchors:
                return f"kernel {node.kernel} has two anchors"
            anchors[node.kernel] = position
        if node.regroups(values) and sizes[node.kernel] != 1:
            return f"{node.name} splits or merges dimensions but is not alone in its kernel"
    materialised: dict[int, set[int]] = {}
    outputs = set(graph.outputs) | set(graph.state_updates())
    for node in graph.nodes:
        for name, ref in node.operand_fields():
            source = kernel_of.get(ref)
            if source is None:
                continue
            if source != node.kernel:
                materialised.setdefault(source, set()).add(ref)
            elif name in node.outside_fields:
                return f"{node.name} reads its {name} from its own kernel"
    for ref in outputs:
        if ref in kernel_of:
            materialised.setdefault(kernel_of[ref], set()).add(ref)
    for kernel, refs in materialised.items():
        for ref in refs:
            if values[ref].is_mask:
                return f"the mask {values[ref].name} is materialised by kernel {kernel}"
    for kernel in anchors:
        # A reduction's result is stored by its kernel's statistics pass,
        # apart from the one result the anchor's loops write.
        results = {
            ref
            for ref in materialised.get(kernel, ())
            if producers.get(ref) is None or producers[ref].op_type != Op.Reduce
        }
        if len(results) != 1:
            return f"anchor kernel {kernel} has {len(results)} materialised results"
    # A kernel gathers its reductions before its anchor runs: no reduction
    # may read, through its own kernel's nodes, the anchor's output.
    for node in graph.nodes:
        if node.op_type != Op.Reduce:
            continue
        pending, seen = [int(node.op.input)], set()
        while pending:
            ref = pending.pop()
            source = producers.get(ref)
            if ref in seen or source is None or source.kernel != node.kernel:
                continue
            seen.add(ref)
            if source.is_anchor:
                return f"the reduction {node.name} reads the anchor of its own kernel {node.kernel}"
            pending.extend(source.operands())
    return None
