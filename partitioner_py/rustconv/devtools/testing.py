"""Checks a model lowered with and without RustConv: rule one of issue 16.

*The presence of RustConvPartitioner in a partitioner list never changes what
the other partitioners see or produce.* :func:`check_others_unchanged` lowers
one model three times, with the other partitioners alone, with RustConv first
and with RustConv last, and compares:

1. **what the others see**: the edge program handed to the partitioners (after
   every decomposition pass) is the same in all three, node for node;
2. **what they produce**, node by node: every node outside RustConv's calls
   sits where it sat without RustConv (the same backend's call, or outside
   every delegate with the same op); a call of another backend made of the
   same nodes as one without RustConv has the same processed bytes. RustConv
   last: the other backends' calls are all exactly those without RustConv
   (they partition before us);
3. optionally **what the program computes**: with ``inputs``, each program
   runs in ``executorch.runtime`` and the outputs with RustConv match those
   without it within ``atol`` (which should be the model's own tolerance, e.g.
   its quantization error).

RustConv first may take nodes another backend would have taken (that is what
putting it first asks for); those nodes are inside RustConv's calls and are not
compared. Any other difference fails with a message naming the node.

Usage, with a function lowering a fresh export through any flow::

    from rustconv.testing import check_others_unchanged, transform_and_lower

    report = check_others_unchanged(
        transform_and_lower(lambda: torch.export.export(model, inputs)),
        others=lambda: [XnnpackPartitioner()],
        inputs=inputs,
    )
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner
from executorch.exir.lowered_backend_module import LoweredBackendModule
from torch.export import ExportedProgram

from rustconv.backend_id import BACKEND_ID

__all__ = [
    "Lowering",
    "RuleOneReport",
    "check_others_unchanged",
    "lower_and_survey",
    "run",
    "transform_and_lower",
]

_DELEGATE = torch.ops.higher_order.executorch_call_delegate


@dataclass
class Call:
    backend_id: str
    nodes: frozenset[str]
    processed_bytes: bytes


@dataclass
class Lowering:
    """One lowering: what the partitioners saw, and where every node went."""

    label: str
    edge: EdgeProgramManager
    #: The edge program's code when ``to_backend`` first ran (what partitioners see).
    seen: str
    calls: list[Call]
    #: Node name -> backend id of its call, or "outside: <op>".
    placement: dict[str, str]
    _program: Any = None

    def executorch_program(self) -> Any:
        """``edge.to_executorch()``, made once (it cannot run twice)."""
        if self._program is None:
            self._program = self.edge.to_executorch()
        return self._program

    def rustconv_nodes(self) -> set[str]:
        return {n for c in self.calls if c.backend_id == BACKEND_ID for n in c.nodes}

    def calls_of_others(self) -> list[Call]:
        return [c for c in self.calls if c.backend_id != BACKEND_ID]


@dataclass
class RuleOneReport:
    without: Lowering
    first: Lowering | None
    last: Lowering | None
    #: Max abs output difference against the program without RustConv.
    max_diff: dict[str, float] = field(default_factory=dict)
    #: Each program's outputs ("absent", "first", "last"), when ``inputs`` were given.
    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)


def transform_and_lower(
    export: Callable[[], ExportedProgram], **kwargs: Any
) -> Callable[[list[Partitioner]], EdgeProgramManager]:
    """A ``lower(partitioners)`` for :func:`check_others_unchanged` through
    ``to_edge_transform_and_lower`` (``kwargs`` passed on, e.g. ``compile_config``)."""

    def lower(partitioners: list[Partitioner]) -> EdgeProgramManager:
        return to_edge_transform_and_lower(export(), partitioner=partitioners, **kwargs)

    return lower


@contextlib.contextmanager
def _recording_what_partitioners_see(seen: list[str]) -> Iterator[None]:
    original = EdgeProgramManager.to_backend

    def to_backend(self, *args, **kwargs):
        if not seen:
            seen.append(_program_text(self))
        return original(self, *args, **kwargs)

    EdgeProgramManager.to_backend = to_backend  # type: ignore[method-assign]
    try:
        yield
    finally:
        EdgeProgramManager.to_backend = original  # type: ignore[method-assign]


def _program_text(edge: EdgeProgramManager) -> str:
    parts = []
    for name in sorted(edge.methods):
        ep = edge.exported_program(name)
        parts.append(f"# method {name}\n{ep.graph_signature}\n{ep.graph_module.code}")
    return "\n".join(parts)


def _op_name(target: Any) -> str:
    return str(getattr(target, "__name__", target))


def _survey(label: str, edge: EdgeProgramManager, seen: str) -> Lowering:
    calls: list[Call] = []
    placement: dict[str, str] = {}
    for method in sorted(edge.methods):
        gm = edge.exported_program(method).graph_module
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is _DELEGATE:
                lm: LoweredBackendModule = getattr(gm, node.args[0].target)
                names = frozenset(
                    f"{method}.{n.name}"
                    for n in lm.original_module.graph.nodes
                    if n.op == "call_function"
                )
                calls.append(Call(lm.backend_id, names, bytes(lm.processed_bytes)))
                for name in names:
                    placement[name] = lm.backend_id
            elif not (
                _op_name(node.target) == "getitem"
                and isinstance(node.args[0], torch.fx.Node)
                and node.args[0].target is _DELEGATE
            ):
                placement[f"{method}.{node.name}"] = f"outside: {_op_name(node.target)}"
    return Lowering(label, edge, seen, calls, placement)


def lower_and_survey(label: str, lower: Callable, partitioners: list[Partitioner]) -> Lowering:
    """``lower(partitioners)``, surveyed: what the partitioners saw and where
    every node went (``label``: "absent", "first" or "last"). A caller that
    needs the program anyway makes its "first" lowering with this and hands
    it to :func:`check_others_unchanged`, which then does not lower again."""
    seen: list[str] = []
    with _recording_what_partitioners_see(seen):
        edge = lower(partitioners)
    return _survey(label, edge, seen[0] if seen else _program_text(edge))


def _first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines(), strict=False)):
        if x != y:
            return f"line {i}:\n  without RustConv: {x.strip()}\n  with RustConv:    {y.strip()}"
    return "one program is longer than the other"


def _check_seen(without: Lowering, other: Lowering) -> None:
    if other.seen != without.seen:
        raise AssertionError(
            f"RustConv {other.label} changed the program the partitioners see, at "
            + _first_difference(without.seen, other.seen)
        )


def _check_placement(without: Lowering, other: Lowering) -> None:
    ours = other.rustconv_nodes()
    for name, where in other.placement.items():
        if name in ours:
            continue
        before = without.placement.get(name)
        if before != where:
            raise AssertionError(
                f"RustConv {other.label}: {name} is {where!r}, without RustConv "
                f"{before!r} (a node outside RustConv's calls must stay where it was)"
            )
    for name, before in without.placement.items():
        if name not in other.placement:
            raise AssertionError(
                f"RustConv {other.label}: {name} ({before}) is gone from the program"
            )
    by_nodes = {(c.backend_id, c.nodes): c for c in without.calls_of_others()}
    for call in other.calls_of_others():
        twin = by_nodes.get((call.backend_id, call.nodes))
        if twin is not None and twin.processed_bytes != call.processed_bytes:
            raise AssertionError(
                f"RustConv {other.label}: the {call.backend_id} call of "
                f"{sorted(call.nodes)} has other contents than without RustConv"
            )


def _check_calls_identical(without: Lowering, other: Lowering) -> None:
    a = [(c.backend_id, c.nodes, c.processed_bytes) for c in without.calls_of_others()]
    b = [(c.backend_id, c.nodes, c.processed_bytes) for c in other.calls_of_others()]
    if a != b:
        raise AssertionError(
            f"RustConv {other.label}: the other backends' calls differ from those "
            f"without RustConv ({len(a)} calls without, {len(b)} with)"
        )


def run(lowering: Lowering, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs of a lowering's program in ``executorch.runtime`` (freshly loaded)."""
    from executorch.runtime import Runtime

    import rustconv.runtime  # noqa: F401  (registers the backend)

    program = lowering.executorch_program()
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    return [t for t in method.execute(list(inputs)) if isinstance(t, torch.Tensor)]


def check_others_unchanged(
    lower: Callable[[list[Partitioner]], EdgeProgramManager],
    others: Callable[[], list[Partitioner]],
    *,
    rustconv: Callable[[], Partitioner] | None = None,
    inputs: Sequence[torch.Tensor] | None = None,
    atol: float = 1e-4,
    min_rustconv_calls: int = 1,
    orders: Sequence[str] = ("first", "last"),
    first: Lowering | None = None,
) -> RuleOneReport:
    """Raises ``AssertionError`` where RustConv's presence changes anything
    outside its own calls (see the module docstring).

    ``lower(partitioners)`` lowers a fresh export with that list; ``others()``
    and ``rustconv()`` make fresh partitioners. ``min_rustconv_calls``: how
    many RustConv calls the lowering with RustConv must have at least (0 for
    a model RustConv should leave alone) when it comes first (last, the others
    may leave it nothing). ``orders``: which of "first" and "last" to lower
    (each lowering of a large model takes minutes). ``first``: the lowering
    with RustConv first, already made by :func:`lower_and_survey` through the same
    ``lower`` from ``[rustconv(), *others()]``, taken instead of a new one.
    """
    if rustconv is None:
        from rustconv import RustConvPartitioner

        rustconv = RustConvPartitioner
    without = lower_and_survey("absent", lower, others())
    if "first" not in orders:
        first = None
    elif first is None:
        first = lower_and_survey("first", lower, [rustconv(), *others()])
    last = lower_and_survey("last", lower, [*others(), rustconv()]) if "last" in orders else None
    if first is not None:
        count = sum(1 for c in first.calls if c.backend_id == BACKEND_ID)
        if count < min_rustconv_calls:
            raise AssertionError(
                f"RustConv first made {count} calls, expected at least {min_rustconv_calls}"
            )
    lowerings = [lowering for lowering in (first, last) if lowering is not None]
    for lowering in lowerings:
        _check_seen(without, lowering)
        _check_placement(without, lowering)
    if last is not None:
        _check_calls_identical(without, last)
    report = RuleOneReport(without, first, last)
    if inputs is not None:
        want = report.outputs["absent"] = run(without, inputs)
        for lowering in lowerings:
            got = report.outputs[lowering.label] = run(lowering, inputs)
            assert len(got) == len(want)
            diff = max((g - w).abs().max().item() for g, w in zip(got, want, strict=True))
            report.max_diff[lowering.label] = diff
            if not diff <= atol:
                raise AssertionError(
                    f"RustConv {lowering.label}: outputs differ from the program without "
                    f"RustConv by {diff:.3e} > {atol:.1e}"
                )
    return report
