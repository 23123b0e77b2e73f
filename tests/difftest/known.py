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

from difftest.generate import prune

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


def _short_depthwise_fed_at_run_time(graph: dict) -> list[tuple[int, str]]:
    """(op index, "w") of each depthwise conv whose weight is not a parameter.

    Seen failing when a call gives at most 4 outputs per row, counting a
    slice folded into the conv (``conv(x, padding=p)[..., :n]``), which the
    spec's shapes do not show; the repair tells."""
    from difftest.generate import Rejected, probe_graph

    params = set(graph.get("params", {}))
    try:
        probe = probe_graph(graph)
    except Rejected:
        return []
    out = []
    for i, op in enumerate(graph["ops"]):
        if op["op"] != "conv" or op["w"] in params:
            continue
        cin = probe.shape(op["x"])[1]
        if op.get("groups", 1) == cin:
            out.append((i, "w"))
    return out


def _weights_as_params(graph: dict) -> dict:
    """Each such weight becomes a fresh parameter of its shape (different
    numbers; the same graph around it)."""
    from difftest.generate import probe_graph

    graph = copy.deepcopy(graph)
    probe = probe_graph(graph)
    for i, key in _short_depthwise_fed_at_run_time(graph):
        op = graph["ops"][i]
        name = f"pfix{i}{key}"
        shape = list(probe.shape(op[key], probe.lengths.index(graph["time"])))
        info = {"shape": shape, "init": "normal", "scale": 0.5}
        dtype = {"torch.float16": "float16", "torch.float32": "float32"}[
            str(probe.dtype_of(op[key]))
        ]
        if dtype != graph["dtype"]:
            info["dtype"] = dtype
        graph["params"][name] = info
        op[key] = name
    return prune(graph)


def _gelu_tanh_ops(graph: dict) -> list[int]:
    return [
        i for i, op in enumerate(graph["ops"]) if op["op"] == "unary" and op["fn"] == "gelu_tanh"
    ]


def _gelu_tanh_to_gelu(graph: dict) -> dict:
    graph = copy.deepcopy(graph)
    for i in _gelu_tanh_ops(graph):
        graph["ops"][i]["fn"] = "gelu"
    return graph


#: Ops whose result is a strided view in eager (torch.export keeps their layout).
_VIEWS = ("transpose", "permute", "slice", "select")


#: Views that keep a strided input strided.
_PASS_THROUGH = ("unsqueeze", "squeeze", "view")


def _linear_layers_on_transposes(graph: dict) -> list[int]:
    """Indices of nn.Linear layers applied to a strided view (through
    unsqueeze/squeeze/view of it)."""
    producer = {op.get("out"): op for op in graph["ops"]}

    def strided(name: str) -> bool:
        op = producer.get(name)
        while op is not None and op["op"] in _PASS_THROUGH:
            op = producer.get(op["x"])
        return op is not None and op["op"] in _VIEWS

    return [
        i
        for i, op in enumerate(graph["ops"])
        if op["op"] == "linear" and op.get("module") and strided(op["x"])
    ]


def _contiguous_before_linear(graph: dict) -> dict:
    graph = copy.deepcopy(graph)
    for i in reversed(_linear_layers_on_transposes(graph)):
        op = graph["ops"][i]
        name = f"{op['out']}_in"
        graph["ops"].insert(i, {"out": name, "op": "clone", "x": op["x"], "form": "contiguous"})
        op["x"] = name
    return graph


KNOWN_BUGS: list[KnownBug] = [
    KnownBug(
        id="xnn_linear_layer_on_transpose",
        summary=(
            "with RustConvPartitioner before XnnpackPartitioner, an nn.Linear applied to a "
            "strided view (a transpose, a slice, a select; no .contiguous() between) fails in "
            "XNNPACK's "
            "ConvertToLinearPass ('t() expects a tensor with <= 2 dimensions'), even with no "
            "conv in the program; XNNPACK alone lowers it (RustConv's decomposition pass "
            "decomposes the aten.linear XNNPACK keeps)"
        ),
        regression="xnn_linear_layer_on_transpose.json",
        applies=lambda g: bool(_linear_layers_on_transposes(g)),
        repair=_contiguous_before_linear,
        flows=("xnn",),
    ),
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
        id="depthwise_short_runtime_weight",
        summary=(
            "a depthwise conv (groups = in = out channels; a channel multiplier of 2 is right) "
            "whose weight reaches the delegate as an input (a graph input, or computed outside "
            "it: permute, squeeze/unsqueeze, flip, ...) returns zeros when a call gives at most "
            "4 outputs per row (a decode step; a slice folded into the conv counts)"
        ),
        regression="depthwise_short_runtime_weight.json",
        applies=lambda g: bool(_short_depthwise_fed_at_run_time(g)),
        repair=_weights_as_params,
    ),
]


def applicable(graph: dict, flow: str) -> list[KnownBug]:
    return [bug for bug in KNOWN_BUGS if flow in bug.flows and bug.applies(graph)]
