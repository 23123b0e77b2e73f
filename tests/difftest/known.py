"""Bugs already found, kept as xfail regressions, recognised without shrinking again.

While a bug is open, random models keep hitting it; shrinking each hit again
would cost the long run most of its time. A known bug says which graphs may
hit it (:attr:`KnownBug.applies`) and how to take its trigger out of a graph
(:attr:`KnownBug.repair`). A failing graph that a bug applies to is repaired
and checked again: if the repaired graph passes, the failure is that bug's
(counted, not shrunk); if it still fails, the repaired graph is triaged as a
new finding, so a known bug never hides another.

When a bug is fixed, its regression's strict xfail turns into a failure
("XPASS"), which says to delete the mark and the entry here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["KnownBug", "KNOWN_BUGS", "applicable"]


@dataclass(frozen=True)
class KnownBug:
    id: str
    summary: str
    regression: str | None  # the file in tests/difftest/regressions (ours only)
    applies: Callable[[dict], bool]
    repair: Callable[[dict], dict]
    #: The flows it shows in.
    flows: tuple[str, ...] = ("edge", "xnn")
    #: Not RustConv's: another backend's or ExecuTorch's (counted apart).
    upstream: bool = False


def _gelu_tanh_ops(graph: dict) -> list[int]:
    return [
        i for i, op in enumerate(graph["ops"]) if op["op"] == "unary" and op["fn"] == "gelu_tanh"
    ]


def _gelu_tanh_to_gelu(graph: dict) -> dict:
    graph = copy.deepcopy(graph)
    for i in _gelu_tanh_ops(graph):
        graph["ops"][i]["fn"] = "gelu"
    return graph


KNOWN_BUGS: list[KnownBug] = [
    KnownBug(
        id="xnnpack_gelu_tanh",
        summary=(
            "XNNPACK (executorch 1.5.1) runs gelu(approximate='tanh') as the exact erf gelu: "
            "off by up to 4.7e-4 on [-4, 4]; shows where RustConv leaves a gelu_tanh to it"
        ),
        regression=None,
        applies=lambda g: bool(_gelu_tanh_ops(g)),
        repair=_gelu_tanh_to_gelu,
        flows=("xnn",),
        upstream=True,
    ),
]


def applicable(graph: dict, flow: str) -> list[KnownBug]:
    return [bug for bug in KNOWN_BUGS if flow in bug.flows and bug.applies(graph)]
