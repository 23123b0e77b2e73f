"""Delta debugging over specs: the smallest program that still fails alike.

:func:`shrink` takes a failing program and a predicate ("still fails with
the same signature") and greedily applies the first simplification that
keeps it failing, until none does or the budget is spent. Simplifications,
roughly from the largest to the smallest step:

* drop graphs (halves, then one at a time), then outputs;
* cut an op out: its users read one of its operands of the same shape
  instead, or its result becomes a fresh input (or parameter), so
  everything before it goes;
* simplify an op's attributes (stride, dilation, padding, groups, bias,
  guards, alpha, slice bounds, the function to ``relu``/``add``...);
* shrink sizes: every occurrence of a channel count or ``K`` at once, then
  single dimensions; the time lengths and the number of calls;
* float16 -> float32; stateful -> dynamic -> static; threads -> 1.

A candidate must first be a valid spec (it runs at every probe length and
its eager outputs are finite), which is cheap to check; only valid ones are
exported and run.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from difftest.generate import Rejected, probe_graph, prune
from difftest.ops import operands
from difftest.spec import shape_at

__all__ = ["shrink", "candidates", "size"]

Predicate = Callable[[dict], bool]


def size(program: dict) -> tuple[int, int, int]:
    """What shrinking minimises: (graphs, ops, elements of all leaves)."""
    graphs = program["graphs"]
    ops = sum(len(g["ops"]) for g in graphs)
    elements = 0
    for g in graphs:
        for kind in ("inputs", "params", "buffers"):
            for info in g.get(kind, {}).values():
                n = 1
                for d in shape_at(info["shape"], g["time"]):
                    n *= d
                elements += n
    return len(graphs), ops, elements


def shrink(
    program: dict,
    predicate: Predicate,
    *,
    budget_s: float = 600.0,
    max_tries: int = 400,
    valid: Callable[[dict], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """The smallest program found for which ``predicate`` still holds."""
    valid = valid or is_valid
    deadline = time.monotonic() + budget_s
    tries = 0
    current = program
    seen: set[str] = set()
    progress = True
    while progress and tries < max_tries and time.monotonic() < deadline:
        progress = False
        for label, cand in candidates(current):
            if tries >= max_tries or time.monotonic() >= deadline:
                break
            key = _key(cand)
            if key in seen:
                continue
            seen.add(key)
            if not valid(cand):
                continue
            tries += 1
            if predicate(cand):
                current = cand
                progress = True
                if log:
                    log(f"shrink: {label} -> {size(current)}")
                break
    return current


def _key(program: dict) -> str:
    import json

    return json.dumps(program, sort_keys=True)


def is_valid(program: dict) -> bool:
    """Builds at every probe length and computes finite, O(1) outputs."""
    try:
        for g in program["graphs"]:
            probe_graph(g)
        from difftest.check import MAX_MAGNITUDE, _run_eager
        from difftest.spec import DiffModel, call_inputs, n_calls

        calls = [call_inputs(program, k) for k in range(n_calls(program))]
        for outs in _run_eager(DiffModel(program), calls):
            for out in outs:
                values = out.double()
                if not torch.isfinite(values).all() or values.abs().max() > MAX_MAGNITUDE:
                    return False
    except (Rejected, Exception):  # noqa: BLE001  (any refusal: not a valid spec)
        return False
    return True


# -- candidates -----------------------------------------------------------


def candidates(program: dict) -> Iterator[tuple[str, dict]]:
    graphs = program["graphs"]
    n = len(graphs)
    if n > 1:
        for part in _partitions(n):
            yield f"keep graphs {part}", {**program, "graphs": [graphs[i] for i in part]}
    for gi, g in enumerate(graphs):
        for label, new in _graph_candidates(g, program):
            out = copy.deepcopy(program)
            out["graphs"][gi] = new
            if label.startswith("mode:"):
                out["mode"] = new["mode"]
            yield f"graph {gi}: {label}", out
    if program.get("threads", 1) != 1:
        yield "threads 1", {**program, "threads": 1}


def _partitions(n: int) -> list[list[int]]:
    """ddmin's subsets: halves, quarters..., then all but one."""
    out = []
    chunk = n // 2
    while chunk >= 1:
        for start in range(0, n, chunk):
            out.append(list(range(start, min(n, start + chunk))))
        chunk //= 2
    for i in range(n):
        out.append([j for j in range(n) if j != i])
    seen, unique = set(), []
    for part in out:
        if part and len(part) < n and tuple(part) not in seen:
            seen.add(tuple(part))
            unique.append(part)
    return unique


def _graph_candidates(g: dict, program: dict) -> Iterator[tuple[str, dict]]:
    if len(g["outputs"]) > 1:
        for name in g["outputs"]:
            yield f"only output {name}", prune({**copy.deepcopy(g), "outputs": [name]})
    yield from _cut_ops(g)
    yield from _simplify_ops(g)
    yield from _shrink_sizes(g)
    yield from _simplify_graph(g, program)


def _outs(op: dict) -> list[str]:
    return op.get("outs") or ([op["out"]] if "out" in op else [])


def _rename(g: dict, old: str, new: str) -> dict:
    """Every read of ``old`` reads ``new`` instead."""
    g = copy.deepcopy(g)
    for op in g["ops"]:
        for key, value in op.items():
            if key in ("out", "outs", "op"):
                continue
            if value == old:
                op[key] = new
            elif isinstance(value, list):
                op[key] = [new if v == old else v for v in value]
            elif isinstance(value, dict) and value.get("size_of") == old:
                value["size_of"] = new
    g["outputs"] = [new if o == old else o for o in g["outputs"]]
    return g


def _probe(g: dict):
    try:
        return probe_graph(g)
    except Exception:  # noqa: BLE001
        return None


def _cut_ops(g: dict) -> Iterator[tuple[str, dict]]:
    probe = _probe(g)
    if probe is None:
        return
    ops = g["ops"]
    # Bypass: users read an operand of the same shape and dtype instead.
    for i in reversed(range(len(ops))):
        op = ops[i]
        if op["op"] == "state_update":
            continue
        for out in _outs(op):
            for src in dict.fromkeys(operands(op)):
                if src == out:
                    continue
                if probe.same_shape(src, out) and probe.dtype_of(src) == probe.dtype_of(out):
                    new = _rename(g, out, src)
                    yield f"bypass {op['op']} {out} -> {src}", prune(new)
    # Replace a value by a fresh leaf: everything that computed it goes.
    for i in range(len(ops)):
        op = ops[i]
        for out in _outs(op):
            leaf = _leaf_for(probe, g, out)
            if leaf is None:
                continue
            kind, info = leaf
            new = copy.deepcopy(g)
            name = f"{'x' if kind == 'inputs' else 'p'}{out}"
            new[kind][name] = info
            new = _rename(new, out, name)
            yield f"{out} ({op['op']}) -> {kind[:-1]}", prune(new)
    # A whole stateful piece: drop the state update.
    for i, op in enumerate(ops):
        if op["op"] == "state_update":
            new = copy.deepcopy(g)
            del new["ops"][i]
            yield "drop state update", prune(new)


def _leaf_for(probe, g: dict, name: str) -> tuple[str, dict] | None:
    dtype = probe.dtype_of(name)
    if dtype not in (torch.float32, torch.float16):
        return None
    axes = probe.time_axes(name)
    shape = probe.time_entries(name)
    if shape is None:
        return None  # a length that is not the call's plus a constant
    info: dict[str, Any] = {"shape": shape}
    stored = {torch.float32: "float32", torch.float16: "float16"}[dtype]
    if stored != g["dtype"]:
        info["dtype"] = stored
    if axes:
        return "inputs", info
    return "params", {**info, "init": "normal"}


#: key -> simpler values to try, per op kind.
_SIMPLER: dict[str, dict[str, list[Any]]] = {
    "conv": {
        "stride": [None],
        "dilation": [None],
        "padding": [None, 0],
        "groups": [None],
        "b": [None],
    },
    "conv_transpose": {
        "stride": [None],
        "dilation": [None],
        "padding": [None],
        "output_padding": [None],
        "groups": [None],
        "b": [None],
    },
    "unary": {"guard": [None], "fn": ["relu", "neg"]},
    "binary": {"alpha": [None], "guard": [None], "fn": ["add", "mul"]},
    "where": {"cmp": ["gt"]},
    "mask": {"cmp": ["gt"]},
    "clamp": {"form": ["clamp"], "min": [None], "max": [None]},
    "slice": {"step": [None], "start": [None], "end": [None]},
    "pad": {"mode": [None], "value": [None]},
    "clone": {"form": [None]},
    "view": {"form": [None]},
    "full_like": {"form": ["full_like"]},
    "split": {"form": ["chunk"]},
    "other_unary": {"fn": ["square"]},
    "reduce": {"fn": ["sum"], "keepdim": [None]},
    "linear": {"b": [None]},
    "layer_norm": {"w": [None], "b": [None]},
    "group_norm": {"w": [None], "b": [None]},
    "batch_norm": {"w": [None], "b": [None]},
}


def _simplify_ops(g: dict) -> Iterator[tuple[str, dict]]:
    for i, op in enumerate(g["ops"]):
        table = _SIMPLER.get(op["op"], {})
        for key, values in table.items():
            if key not in op:
                continue
            for value in values:
                if op.get(key) == value:
                    continue
                new = copy.deepcopy(g)
                if value is None:
                    del new["ops"][i][key]
                else:
                    new["ops"][i][key] = value
                if op["op"] == "split" and key == "form":
                    new["ops"][i]["chunks"] = len(op["outs"])
                yield f"{op['op']} {_outs(op)} {key}={value}", prune(new)
        # A tensor operand of an elementwise op becomes a number.
        if op["op"] in ("binary", "where"):
            for key in ("b", "cb", "x", "y"):
                if isinstance(op.get(key), str) and key in op:
                    if op["op"] == "where" and key == "x" and op.get("y") is not None:
                        pass
                    new = copy.deepcopy(g)
                    new["ops"][i][key] = {"scalar": 1.0}
                    yield f"{op['op']} {_outs(op)} {key}=1.0", prune(new)
        if op["op"] == "pad" and op.get("pads") not in ([0, 1], [1, 0]):
            for pads in ([0, 0], [op["pads"][0], 0], [0, op["pads"][1]]):
                new = copy.deepcopy(g)
                new["ops"][i]["pads"] = pads
                yield f"pad {_outs(op)} {pads}", prune(new)


def _shrink_sizes(g: dict) -> Iterator[tuple[str, dict]]:
    # Every occurrence of a size at once (a channel count, a K), then one at a time.
    sizes: dict[int, int] = {}
    for kind in ("inputs", "params", "buffers"):
        for info in g[kind].values():
            for d in info["shape"]:
                if isinstance(d, int) and d > 1:
                    sizes[d] = sizes.get(d, 0) + 1
    for value in sorted(sizes, reverse=True):
        for smaller in sorted({1, 2, value // 2, value - 1}):
            if not 1 <= smaller < value:
                continue
            new = copy.deepcopy(g)
            for kind in ("inputs", "params", "buffers"):
                for info in new[kind].values():
                    info["shape"] = [smaller if d == value else d for d in info["shape"]]
            for op in new["ops"]:
                if op.get("groups") == value:
                    op["groups"] = smaller
                if op["op"] == "split" and op.get("sizes"):
                    op["sizes"] = [smaller if s == value else s for s in op["sizes"]]
            yield f"size {value} -> {smaller} everywhere", new
    for kind in ("inputs", "params", "buffers"):
        for name, info in g[kind].items():
            for axis, d in enumerate(info["shape"]):
                if isinstance(d, int) and d > 1:
                    for smaller in sorted({1, d // 2, d - 1}):
                        if smaller < 1:
                            continue
                        new = copy.deepcopy(g)
                        new[kind][name]["shape"][axis] = smaller
                        yield f"{name} dim {axis}: {d} -> {smaller}", new
    # Time lengths.
    calls = g["calls"]
    if g["mode"] == "static":
        for t in sorted({1, 2, 4, g["time"] // 2, g["time"] - 1}):
            if 1 <= t < g["time"]:
                new = {**copy.deepcopy(g), "time": t, "tmin": t, "tmax": t, "calls": [t]}
                yield f"time {t}", new
    else:
        if len(calls) > 1:
            for i in range(len(calls)):
                yield f"drop call {i}", {**copy.deepcopy(g), "calls": calls[:i] + calls[i + 1 :]}
        for i, c in enumerate(calls):
            for t in sorted({g["tmin"], 1, 2, c // 2, c - 1}):
                if g["tmin"] <= t < c:
                    new = copy.deepcopy(g)
                    new["calls"][i] = t
                    yield f"call {i} length {t}", new
        for t in sorted({g["tmin"] + 1, 2, 4, g["time"] // 2}):
            if max(2, g["tmin"]) <= t < g["time"]:
                yield f"example time {t}", {**copy.deepcopy(g), "time": t}


def _simplify_graph(g: dict, program: dict) -> Iterator[tuple[str, dict]]:
    if g["dtype"] == "float16":
        new = copy.deepcopy(g)
        new["dtype"] = "float32"
        for kind in ("inputs", "params", "buffers"):
            for info in new[kind].values():
                info.pop("dtype", None)
        for op in new["ops"]:
            if op["op"] == "cast":
                op["to"] = "float32"
        yield "float32", new
    for kind in ("inputs", "params", "buffers"):
        for name, info in g[kind].items():
            if info.get("init", "normal") == "normal" and ("scale" in info or "shift" in info):
                new = copy.deepcopy(g)
                new[kind][name].pop("scale", None)
                new[kind][name].pop("shift", None)
                yield f"{name} unscaled", new
            if kind == "buffers" and info.get("init") != "zeros":
                new = copy.deepcopy(g)
                new[kind][name]["init"] = "zeros"
                yield f"{name} zeros", new
    if len(program["graphs"]) > 1:
        return  # a program's graphs share its mode
    if g["mode"] == "stateful" and not g["buffers"]:
        yield "mode: dynamic", {**copy.deepcopy(g), "mode": "dynamic"}
    if g["mode"] == "dynamic":
        t = g["calls"][0]
        yield "mode: static", {**copy.deepcopy(g), "mode": "static", "time": t, "tmin": t,
                               "tmax": t, "calls": [t]}  # fmt: skip
