"""Specs (JSON) of random models, and the torch modules they build.

A *program* is what one ``torch.export`` sees: several independent *graphs*
(sub-graphs, each a small random model with its own inputs, parameters,
buffers and outputs). Its forward takes every graph's inputs, in graph order,
and returns every graph's outputs, so a mismatch is attributed to the graph
whose output it is. One graph alone is a program too (shrinking works on
those, and the regression folder holds them).

Program::

    {"version": 1, "seed": 7, "mode": "static" | "dynamic" | "stateful",
     "threads": 2, "graphs": [graph, ...]}

Graph::

    {"seed": 123,                  # parameters and inputs are drawn from it
     "dtype": "float32" | "float16",
     "time": 12,                   # the time length of the example inputs
     "tmin": 1, "tmax": 64,        # the Dim range (dynamic and stateful)
     "calls": [7, 1, 1],           # the time length of each call, in order
     "inputs":  {"x0": {"shape": [1, 4, "T"]}},   # "T": the call's length ("T+2": 2 more)
     "params":  {"p0": {"shape": [4, 1, 3], "init": "normal", "scale": 0.6}},
     "buffers": {"s0": {"shape": [1, 4, 2], "init": "normal"}},
     "ops": [{"op": "conv", "out": "v1", "x": "x0", "w": "p0", ...}, ...],
     "outputs": ["v1"]}

``ops`` is in SSA form: each op writes ``out`` (or ``outs`` for a split) and
reads earlier names; :mod:`difftest.ops` says what each kind computes.
A call's inputs differ from call to call (weights fed at run time too), and
all are drawn from the graph's seed, the call index and the input's name, so
a graph computes the same numbers alone or inside any program.
"""

from __future__ import annotations

import copy
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from difftest.ops import DTYPES, OpContext, build_module, run_op

__all__ = [
    "VERSION",
    "time_offset",
    "time_entry",
    "shape_at",
    "DiffModel",
    "call_inputs",
    "example_inputs",
    "dynamic_shapes",
    "graph_dtype",
    "load",
    "dump",
    "single",
    "subset",
    "tensor_init",
]

VERSION = 1


def graph_dtype(graph: dict) -> torch.dtype:
    return DTYPES[graph["dtype"]]


def _rng(*keys: Any) -> np.random.Generator:
    words = [zlib.crc32(str(k).encode()) for k in keys]
    return np.random.default_rng(words)


def tensor_init(info: dict, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """float64 values for a parameter, buffer or input described by ``info``."""
    init = info.get("init", "normal")
    scale = float(info.get("scale", 1.0))
    if init == "normal":
        data = rng.standard_normal(shape) * scale + float(info.get("shift", 0.0))
    elif init == "positive":  # variances, normaliser gains
        data = rng.uniform(0.5, 1.5, shape) * scale
    elif init == "zeros":
        data = np.zeros(shape)
    elif init == "ones":
        data = np.ones(shape)
    elif init == "ramp":
        n = int(np.prod(shape)) if shape else 1
        data = np.linspace(-scale, scale, n).reshape(shape)
    else:
        raise ValueError(f"unknown init {init!r}")
    return np.asarray(data, dtype=np.float64)


def time_offset(d: Any) -> int | None:
    """The ``c`` of a time entry ``"T"``, ``"T+c"`` or ``"T-c"``; None for a static size."""
    if not isinstance(d, str):
        return None
    if d == "T":
        return 0
    if not d.startswith(("T+", "T-")):
        raise ValueError(f"bad size {d!r}")
    return int(d[1:])


def time_entry(offset: int) -> str:
    """The shape entry of a length ``offset`` more than the call's."""
    return "T" if offset == 0 else f"T{offset:+d}"


def _shape(shape: list, length: int) -> list[int]:
    out = []
    for d in shape:
        offset = time_offset(d)
        out.append(int(d) if offset is None else length + offset)
    return out


def _stored_dtype(graph: dict, info: dict, reference: bool) -> torch.dtype:
    if reference:
        return torch.float64
    return DTYPES[info.get("dtype", graph["dtype"])]


class DiffModel(nn.Module):
    """The program as a module; ``reference=True`` computes in float64.

    In the reference, every parameter, buffer and input holds exactly the
    value the model holds in its own dtype (float16 values are rounded first),
    so the two differ only in the arithmetic.
    """

    def __init__(self, program: dict, reference: bool = False) -> None:
        super().__init__()
        self.program = program
        self.reference = reference
        #: Per graph, the closest a comparison's operands came (reference only).
        self.margins: list[float] = [float("inf")] * len(program["graphs"])
        self._names: list[dict[str, str]] = []
        self._modules_of: list[dict[str, str]] = []
        for gi, graph in enumerate(program["graphs"]):
            names = {}
            for name, info in graph.get("params", {}).items():
                attr = f"g{gi}_{name}"
                data = tensor_init(info, info["shape"], _rng(graph["seed"], "param", name))
                stored = DTYPES[info.get("dtype", graph["dtype"])]
                value = torch.from_numpy(data).to(stored).to(_stored_dtype(graph, info, reference))
                self.register_parameter(attr, nn.Parameter(value))
                names[name] = attr
            for name, info in graph.get("buffers", {}).items():
                attr = f"g{gi}_{name}"
                data = tensor_init(info, info["shape"], _rng(graph["seed"], "buffer", name))
                stored = DTYPES[info.get("dtype", graph["dtype"])]
                value = torch.from_numpy(data).to(stored).to(_stored_dtype(graph, info, reference))
                self.register_buffer(attr, value)
                names[name] = attr
            self._names.append(names)
            # Layers: their parameters move into the module (and out of the top level).
            modules = {}
            for op in graph["ops"]:
                if not op.get("module"):
                    continue
                leaves = {name: _get(self, attr) for name, attr in names.items()}
                module, taken = build_module(op, leaves)
                attr = f"g{gi}_{op['out']}"
                self.add_module(attr, module)
                modules[op["out"]] = attr
                for name, inner in taken.items():
                    top = names[name]
                    if "." not in top:
                        delattr(self, top)
                    names[name] = f"{attr}.{inner}"
            self._modules_of.append(modules)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = iter(inputs)
        outputs = []
        for gi, graph in enumerate(self.program["graphs"]):
            env: dict[str, Any] = {name: next(flat) for name in graph["inputs"]}
            names = self._names[gi]
            for name, attr in names.items():
                env[name] = _get(self, attr)
            dtype = torch.float64 if self.reference else graph_dtype(graph)
            margins: list[float] | None = [] if self.reference else None
            modules = {out: getattr(self, attr) for out, attr in self._modules_of[gi].items()}
            ctx = OpContext(dtype, self.reference, self, names, margins, modules)
            for op in graph["ops"]:
                result = run_op(op, env, ctx)
                if "outs" in op:
                    env.update(zip(op["outs"], result, strict=True))
                elif "out" in op:
                    env[op["out"]] = result
            if margins:
                self.margins[gi] = min(self.margins[gi], *margins)
            outputs.extend(env[name] for name in graph["outputs"])
        return tuple(outputs)


def _get(module: nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part)
    return module


shape_at = _shape


def call_inputs(program: dict, call: int, reference: bool = False) -> list[torch.Tensor]:
    """The flat inputs of call ``call`` (example inputs: ``call=-1``)."""
    flat = []
    for graph in program["graphs"]:
        length = graph["time"] if call < 0 else graph["calls"][call]
        for name, info in graph["inputs"].items():
            shape = _shape(info["shape"], length)
            data = tensor_init(info, shape, _rng(graph["seed"], "input", call, name))
            stored = DTYPES[info.get("dtype", graph["dtype"])]
            tensor = torch.from_numpy(data).to(stored)
            flat.append(tensor.to(torch.float64) if reference else tensor)
    return flat


def example_inputs(program: dict) -> tuple[torch.Tensor, ...]:
    return tuple(call_inputs(program, -1))


def dynamic_shapes(program: dict) -> tuple | None:
    """One ``Dim`` per graph for its time axis; None for a static program."""
    if program["mode"] == "static":
        return None
    from torch.export import Dim

    shapes = []
    for gi, graph in enumerate(program["graphs"]):
        dim = Dim(f"t{gi}", min=graph["tmin"], max=graph["tmax"])
        for info in graph["inputs"].values():
            axes = {
                axis: dim + time_offset(d) if time_offset(d) else dim
                for axis, d in enumerate(info["shape"])
                if time_offset(d) is not None
            }
            shapes.append(axes or None)
    return (tuple(shapes),)  # forward(*inputs): one varargs argument


def n_calls(program: dict) -> int:
    counts = {len(g["calls"]) for g in program["graphs"]}
    if len(counts) != 1:
        raise ValueError(f"graphs disagree on the number of calls: {sorted(counts)}")
    return counts.pop()


def output_owner(program: dict) -> list[tuple[int, int]]:
    """(graph index, output index within the graph) of each flat output."""
    return [(gi, oi) for gi, g in enumerate(program["graphs"]) for oi in range(len(g["outputs"]))]


def subset(program: dict, indices: list[int]) -> dict:
    """The program with only the graphs at ``indices``."""
    out = copy.deepcopy(program)
    out["graphs"] = [copy.deepcopy(program["graphs"][i]) for i in indices]
    return out


def single(program: dict, index: int) -> dict:
    return subset(program, [index])


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def dump(program: dict, path: str | Path | None = None) -> str:
    text = json.dumps(program, indent=1, sort_keys=False)
    if path is not None:
        Path(path).write_text(text + "\n")
    return text
