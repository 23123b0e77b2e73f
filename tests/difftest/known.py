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


_NARROW = ("float16", "bfloat16")


def _narrow_cumsums(graph: dict) -> list[tuple[int, str]]:
    """The cumsums of float16 or bfloat16 values, with that dtype: those a
    cast makes so, or any other of a graph of that dtype."""
    casts = {op["out"]: op["to"] for op in graph["ops"] if op["op"] == "cast"}
    found = []
    for i, op in enumerate(graph["ops"]):
        if op["op"] == "cumsum" and (dtype := casts.get(op["x"], graph["dtype"])) in _NARROW:
            found.append((i, dtype))
    return found


def _cumsums_in_float32(graph: dict) -> dict:
    """Each narrow cumsum as ``cast(cumsum(cast(x, float32)), its dtype)``:
    what eager computes (its running sum in float32, each output rounded)."""
    graph = copy.deepcopy(graph)
    for i, dtype in reversed(_narrow_cumsums(graph)):
        op = graph["ops"][i]
        out = op["out"]
        graph["ops"][i : i + 1] = [
            {"out": f"{out}_w", "op": "cast", "x": op["x"], "to": "float32"},
            {**op, "out": f"{out}_s", "x": f"{out}_w"},
            {"out": out, "op": "cast", "x": f"{out}_s", "to": dtype},
        ]
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
    KnownBug(
        id="portable_half_cumsum",
        summary=(
            "ExecuTorch's portable cumsum (executorch 1.5.1) keeps a float16 or bfloat16 "
            "running sum in that dtype, where eager sums in float32: seed 52031's 57-step "
            "cumsum ended 3.4x further from the float64 reference than eager's, and a scan "
            "after it (|a| ~ 1 over 60 steps) took the difference to 5 float16 ulps. Shows "
            "where a cumsum sits between RustConv's calls"
        ),
        regression=None,
        applies=lambda g: bool(_narrow_cumsums(g)),
        repair=_cumsums_in_float32,
        upstream=True,
    ),
]


def applicable(graph: dict, flow: str) -> list[KnownBug]:
    return [bug for bug in KNOWN_BUGS if flow in bug.flows and bug.applies(graph)]
