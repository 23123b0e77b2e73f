"""Random graphs from a seed, built op by op on meta tensors.

Every op the generator proposes is run at once (through the same functions
as the model, :mod:`difftest.ops`) on meta tensors at each *probe length*: the
example length, every call's length, and the ends of the ``Dim`` range. An op
that torch refuses, or that gives an empty tensor, a varying rank or a
varying static size at some probe, is dropped and another is tried, so every
spec the generator writes builds and runs at every length it will be called
with. The axis whose size varies across probes is the time axis; that is
how the generator knows where time is after transposes, selects and views.

What a graph contains, roughly in proportion (see :data:`ACTIONS`): convs of
random groups, stride, dilation, K, padding (an int, "same", "valid", an
explicit ``F.pad``, causal pads, padding cut back by a slice of the input's
length), with weights and biases that are parameters, run-time inputs or
computed from them by views, ``permute``, ``flip``, slices, casts and weight
normalisation; linear scans; elementwise chains with NumPy broadcasting,
scalars and ``full_like``; comparisons with ``where``; clamps; transposes,
permutes, squeeze/unsqueeze views, slices (static, negative, of a length
read at run time), selects, chunks/splits, ``F.glu``, ``cat``; clones; ops RustConv does
not run (linear, matmul, norms, softmax, reductions, ...) in between; in
stateful programs, a conv state or a scan state kept in a buffer and
updated with ``copy_``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch

from difftest.ops import DTYPES, OpContext, module_kinds, operands, run_op
from difftest.spec import shape_at, time_entry

__all__ = ["generate_program", "generate_graph", "Probe", "probe_graph", "ACTIONS"]

MODES = ("static", "dynamic", "stateful")
MAX_ELEMENTS = 1 << 18
MAX_CHANNELS = 64


class Rejected(Exception):
    """An op the probes refuse."""


def _meta(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=dtype)


def probe_lengths(graph: dict) -> list[int]:
    """The time lengths a graph must be valid at."""
    lengths = {graph["time"], *graph["calls"]}
    if graph.get("mode", "static") != "static":
        lengths |= {graph["tmin"], graph["tmax"]}
    else:
        # A second length, only to tell the time axis apart.
        lengths.add(graph["time"] + 5)
    return sorted(lengths)


class Probe:
    """Meta tensors of every value of a graph at each probe length."""

    def __init__(self, graph: dict, lengths: list[int] | None = None) -> None:
        self.graph = graph
        self.lengths = lengths or probe_lengths(graph)
        self.dtype = DTYPES[graph["dtype"]]
        self.dynamic = graph.get("mode", "static") != "static"
        self.env: list[dict[str, Any]] = [{} for _ in self.lengths]
        for name, info in graph["inputs"].items():
            self._leaf(name, info, time=True)
        for kind in ("params", "buffers"):
            for name, info in graph.get(kind, {}).items():
                self._leaf(name, info, time=False)

    def _leaf(self, name: str, info: dict, time: bool) -> None:
        dtype = DTYPES[info.get("dtype", self.graph["dtype"])]
        for env, length in zip(self.env, self.lengths, strict=True):
            shape = shape_at(info["shape"], length)
            env[name] = _meta(shape, dtype)

    def run(self, op: dict) -> None:
        """Runs ``op`` at every probe; :class:`Rejected` if any refuses it."""
        results = []
        for env in self.env:
            try:
                if op["op"] == "state_update":
                    buffer, value = env[op["buffer"]], env[op["x"]]
                    if buffer.shape != value.shape or buffer.dtype != value.dtype:
                        raise Rejected(f"state {tuple(buffer.shape)} <- {tuple(value.shape)}")
                    results.append(None)
                    continue
                results.append(run_op(op, env, OpContext(dtype=self.dtype)))
            except Rejected:
                raise
            except Exception as e:  # torch's own refusal: a shape, a dtype
                raise Rejected(f"{type(e).__name__}: {e}") from None
        names = op.get("outs") or ([op["out"]] if "out" in op else [])
        if "outs" in op:
            for r in results:
                if len(r) != len(names):
                    raise Rejected("split piece count varies with the length")
            per_name = [[r[i] for r in results] for i in range(len(names))]
        else:
            per_name = [results] if names else []
        for name, values in zip(names, per_name, strict=True):
            _check_consistent(values)
            if self.dynamic:
                self._check_derived_lengths(values)
            for env, value in zip(self.env, values, strict=True):
                env[name] = value

    def _check_derived_lengths(self, values: list[torch.Tensor]) -> None:
        """A time length other than the input's is at least 2 everywhere in the
        range: torch.export specialises sizes of 1 and refuses the ``Dim``."""
        for axis in range(values[0].dim()):
            sizes = [v.shape[axis] for v in values]
            if len(set(sizes)) == 1 or sizes == self.lengths:
                continue
            if min(sizes) < 2:
                raise Rejected(f"time lengths {sizes} at lengths {self.lengths}")

    def shape(self, name: str, probe: int = 0) -> tuple[int, ...]:
        return tuple(self.env[probe][name].shape)

    def dtype_of(self, name: str) -> torch.dtype:
        return self.env[0][name].dtype

    def time_axes(self, name: str) -> list[int]:
        shapes = [tuple(env[name].shape) for env in self.env]
        return [a for a in range(len(shapes[0])) if len({s[a] for s in shapes}) > 1]

    def time_entries(self, name: str) -> list | None:
        """``name``'s shape as an input's (``"T+c"`` on its time axis), or None
        where its length is not the call's plus a constant."""
        shapes = [tuple(env[name].shape) for env in self.env]
        out: list = list(shapes[0])
        for axis in self.time_axes(name):
            offsets = {s[axis] - length for s, length in zip(shapes, self.lengths, strict=True)}
            if len(offsets) != 1:
                return None
            out[axis] = time_entry(offsets.pop())
        return out

    def same_shape(self, a: str, b: str) -> bool:
        return all(tuple(env[a].shape) == tuple(env[b].shape) for env in self.env)


def _check_consistent(values: list[torch.Tensor]) -> None:
    ranks = {v.dim() for v in values}
    if len(ranks) != 1:
        raise Rejected("rank varies with the length")
    for v in values:
        if v.numel() == 0 or any(d < 1 for d in v.shape):
            raise Rejected(f"empty tensor {tuple(v.shape)}")
        if v.numel() > MAX_ELEMENTS:
            raise Rejected(f"too large {tuple(v.shape)}")
    varying = [a for a in range(values[0].dim()) if len({v.shape[a] for v in values}) > 1]
    if len(varying) > 1:
        raise Rejected("two axes vary with the length")


def probe_graph(graph: dict, lengths: list[int] | None = None) -> Probe:
    """Runs every op of ``graph`` at its probes; :class:`Rejected` if one fails."""
    probe = Probe(graph, lengths)
    for op in graph["ops"]:
        probe.run(op)
    for name in graph["outputs"]:
        if name not in probe.env[0]:
            raise Rejected(f"output {name} is not computed")
    return probe


# -- the generator --------------------------------------------------------


def _weighted(rng: random.Random, table: dict[Any, float]) -> Any:
    keys = list(table)
    return rng.choices(keys, weights=[table[k] for k in keys])[0]


UNARY_FNS = {
    "neg": 1,
    "abs": 1,
    "relu": 2,
    "sigmoid": 2,
    "tanh": 2,
    "silu": 3,
    "gelu": 2,
    "gelu_tanh": 1,
    "exp": 1,
    "log": 1,
    "log1p": 1,
    "softplus": 2,
    "sqrt": 1,
    "rsqrt": 1,
    "reciprocal": 1,
    "hardtanh": 1,
    "relu6": 1,
    "elu": 1,
    "leaky_relu": 1,
    "prelu": 1,
    "sin": 1,
    "cos": 1,
}
#: The guard a unary op gets (the model stays finite and well conditioned).
UNARY_GUARDS = {
    "exp": ["tanh"],
    "log": ["abs1", "abs_half"],
    "log1p": ["abs_half"],
    "sqrt": ["abs1", "abs_half"],
    "rsqrt": ["abs1", "abs_half"],
    "reciprocal": ["abs1", "sigmoid_half"],
}
OTHER_UNARY = ["erf", "square", "hardswish"]
CMPS = ["gt", "ge", "lt", "le", "eq", "ne"]


class GraphGen:
    """Builds one graph; each ``a_*`` action appends ops and returns the new
    current value (or None when it could not apply here)."""

    def __init__(self, rng: random.Random, graph: dict, big: bool) -> None:
        self.rng = rng
        self.g = graph
        self.big = big
        self.probe = Probe(graph)
        self.n = 0
        self.dtype = DTYPES[graph["dtype"]]
        self.stateful = graph["mode"] == "stateful"
        self.static = graph["mode"] == "static"

    # -- names and leaves --

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def input(self, shape: list, **info: Any) -> str:
        name = self._name("x")
        self.g["inputs"][name] = {"shape": list(shape), **info}
        self.probe._leaf(name, self.g["inputs"][name], time=True)
        return name

    def param(self, shape: list[int], scale: float = 1.0, init: str = "normal", **info) -> str:
        name = self._name("p")
        entry = {"shape": list(shape), "init": init, **info}
        if scale != 1.0:
            entry["scale"] = round(scale, 4)
        self.g["params"][name] = entry
        self.probe._leaf(name, entry, time=False)
        return name

    def buffer(self, shape: list[int], init: str = "zeros") -> str:
        # Zeros, as models start their states: a program ExecuTorch plans the
        # buffer of (one RustConv does not own) starts it at zero whatever its
        # exported value.
        name = self._name("s")
        self.g["buffers"][name] = {"shape": list(shape), "init": init}
        self.probe._leaf(name, self.g["buffers"][name], time=False)
        return name

    def layer(self, op: dict, p: float) -> dict:
        """``op`` computed by an ``nn.Module`` (Conv1d, Linear, LayerNorm, SiLU...)
        with probability ``p``, where its parameters are plain and its own."""
        params = self.g["params"]
        buffers = self.g["buffers"]
        leaves = [op.get(k) for k in ("w", "b", "mean", "var") if op.get(k) is not None]
        plain = all(name in params or name in buffers for name in leaves)
        if plain and module_kinds(op) and self.rng.random() < p:
            op["module"] = True
        return op

    def emit(self, op: dict, outs: int = 0) -> Any:
        """Appends ``op`` if every probe accepts it; its output name(s) or None."""
        op = dict(op)
        if outs:
            op["outs"] = [self._name("v") for _ in range(outs)]
        elif op["op"] != "state_update":
            op = {"out": self._name("v"), **op}
        try:
            self.probe.run(op)
        except Rejected:
            return None
        self.g["ops"].append(op)
        return op.get("outs") or op.get("out") or True

    def shape(self, name: str) -> tuple[int, ...]:
        return self.probe.shape(name, self.probe.lengths.index(self.g["time"]))

    def time_axis(self, name: str) -> int | None:
        axes = self.probe.time_axes(name)
        return axes[0] if axes else None

    def acts(self, like: str | None = None) -> list[str]:
        """Computed values (not leaves) with a time axis; same shape as ``like``."""
        out = []
        for op in self.g["ops"]:
            for name in op.get("outs") or ([op["out"]] if "out" in op else []):
                if self.time_axis(name) is None:
                    continue
                if self.probe.dtype_of(name) != self.dtype:
                    continue
                if like is None or self.probe.same_shape(name, like):
                    out.append(name)
        return out

    # -- operands --

    def scalar(self, nonzero: bool = False) -> dict:
        r = self.rng
        value = r.choice([0.5, 2.0, -1.0, 0.25, 1.5, -0.75, 3.0, 0.1])
        if not nonzero and r.random() < 0.1:
            value = 0.0
        return {"scalar": value}

    def broadcast_shape(self, like: str) -> list[int]:
        """A static shape that broadcasts to ``like`` (time and some axes 1)."""
        shape = list(self.shape(like))
        t = self.time_axis(like)
        out = [1 if (a == t or self.rng.random() < 0.4) else d for a, d in enumerate(shape)]
        drop = self.rng.randint(0, len(out))  # leading dims may go
        while drop and out and out[0] == 1:
            out.pop(0)
            drop -= 1
        if not out and self.rng.random() < 0.5:
            return []  # 0-d: a scalar parameter, folded at export
        return out or [1]

    def operand(self, like: str, allow_scalar: bool = True) -> Any:
        """Something to combine with ``like`` elementwise."""
        r = self.rng
        choice = _weighted(
            r,
            {
                "scalar": 3 if allow_scalar else 0,
                "param": 4,
                "same": 3,
                "input": 2,
                "input_bcast": 1,
                "row": 2,
                "full_like": 1,
            },
        )
        if choice == "scalar":
            return self.scalar()
        if choice == "param":
            return self.param(self.broadcast_shape(like), scale=1.0)
        if choice == "same":
            same = [a for a in self.acts(like) if a != like]
            if same:
                return r.choice(same[-4:])
            choice = "input"
        if choice == "input":
            shape = self.probe.time_entries(like)
            if shape is not None:
                return self.input(shape)
            return self.param(self.broadcast_shape(like))
        if choice == "input_bcast":
            return self.input(self.broadcast_shape(like))
        if choice == "row":
            # A one-channel slice of an activation: [B, 1, T] against [B, C, T].
            t = self.time_axis(like)
            axes = [a for a, d in enumerate(self.shape(like)) if a != t and d > 1]
            if axes:
                axis = r.choice(axes)
                start = r.randrange(self.shape(like)[axis])
                sliced = self.emit(
                    {"op": "slice", "x": like, "dim": axis, "start": start, "end": start + 1}
                )
                if sliced:
                    return sliced
            return self.scalar()
        full = self.emit(
            {
                "op": "full_like",
                "x": like,
                "form": r.choice(["full_like", "zeros_like", "ones_like"]),
                "fill": r.choice([0.5, -2.0, 1.25]),
            }
        )
        return full or self.scalar()

    # -- actions on the current value --

    def a_unary(self, cur: str) -> str | None:
        fn = _weighted(self.rng, UNARY_FNS)
        op = {"op": "unary", "fn": fn, "x": cur}
        if fn in UNARY_GUARDS:
            op["guard"] = self.rng.choice(UNARY_GUARDS[fn])
        return self.emit(self.layer(op, 0.3))

    def a_binary(self, cur: str) -> str | None:
        r = self.rng
        fn = _weighted(r, {"add": 4, "sub": 2, "mul": 4, "div": 1, "maximum": 1, "minimum": 1})
        other = self.operand(cur, allow_scalar=fn not in ("maximum", "minimum"))
        a, b = cur, other
        if isinstance(other, str) and r.random() < 0.3:
            a, b = other, cur
        elif isinstance(other, dict) and fn in ("sub", "mul", "div") and r.random() < 0.3:
            a, b = other, cur  # 2.0 - x, 2.0 * x, 2.0 / x
        op = {"op": "binary", "fn": fn, "a": a, "b": b}
        if fn == "div" and isinstance(b, str):
            op["guard"] = r.choice(["abs1", "sigmoid_half"])
        if fn == "div" and isinstance(b, dict) and b["scalar"] == 0.0:
            op["b"] = {"scalar": 2.0}
        if fn == "add" and r.random() < 0.15 and isinstance(b, str):
            op["alpha"] = r.choice([0.5, 2.0, -1.0])
        return self.emit(op)

    def a_where(self, cur: str) -> str | None:
        r = self.rng
        cb = self.operand(cur)
        x = cur if r.random() < 0.7 else self.operand(cur)
        y = self.operand(cur) if r.random() < 0.7 else self.scalar()
        if isinstance(x, dict) and isinstance(y, dict) and r.random() < 0.5:
            x = cur
        return self.emit(
            {"op": "where", "cmp": r.choice(CMPS), "ca": cur, "cb": cb, "x": x, "y": y}
        )

    def a_mask(self, cur: str) -> str | None:
        r = self.rng
        mask = self.emit({"op": "mask", "cmp": r.choice(CMPS), "a": cur, "b": self.operand(cur)})
        if not mask:
            return None
        return self.emit({"op": "binary", "fn": r.choice(["mul", "add"]), "a": cur, "b": mask})

    def a_clamp(self, cur: str) -> str | None:
        r = self.rng
        lo = r.choice([-2.0, -1.0, -0.5, 0.0])
        hi = r.choice([0.25, 0.5, 1.0, 3.0])
        form = r.choice(["clamp", "clamp", "clamp_min", "clamp_max", "hardtanh"])
        op = {"op": "clamp", "form": form, "x": cur, "min": lo, "max": hi}
        if form == "clamp" and r.random() < 0.3:
            op[r.choice(["min", "max"])] = None
        return self.emit(op)

    def a_transpose(self, cur: str) -> str | None:
        rank = len(self.shape(cur))
        if rank < 2:
            return None
        if self.rng.random() < 0.6:
            d0, d1 = self.rng.sample(range(rank), 2)
            if self.rng.random() < 0.5:
                d0, d1 = d0 - rank, d1 - rank
            return self.emit({"op": "transpose", "x": cur, "d0": d0, "d1": d1})
        dims = list(range(rank))
        self.rng.shuffle(dims)
        return self.emit({"op": "permute", "x": cur, "dims": dims})

    def a_view(self, cur: str) -> str | None:
        r = self.rng
        shape = self.shape(cur)
        ones = [a for a, d in enumerate(shape) if d == 1 and a != self.time_axis(cur)]
        kind = r.choice(["unsqueeze", "squeeze", "view", "view"])
        if len(shape) >= 4:
            kind = "squeeze" if r.random() < 0.5 else "view_remove"
        if kind in ("squeeze", "view_remove") and not ones:
            return None
        if kind == "unsqueeze":
            return self.emit({"op": "unsqueeze", "x": cur, "dim": r.randint(0, len(shape))})
        if kind == "squeeze":
            return self.emit({"op": "squeeze", "x": cur, "dim": r.choice(ones)})
        form = r.choice(["view", "reshape"])
        if kind == "view_remove" or (ones and r.random() < 0.4):
            return self.emit({"op": "view", "x": cur, "remove": r.choice(ones), "form": form})
        return self.emit({"op": "view", "x": cur, "insert": r.randint(0, len(shape)), "form": form})

    def a_slice(self, cur: str) -> str | None:
        r = self.rng
        shape = self.shape(cur)
        t = self.time_axis(cur)
        if t is not None and r.random() < 0.6:
            dim = t if r.random() < 0.5 else t - len(shape)
            kind = r.choice(["start", "end", "both", "from_end", "neg_start", "step"])
            op: dict[str, Any] = {"op": "slice", "x": cur, "dim": dim}
            if kind == "start":
                op["start"] = r.randint(1, 3)
            elif kind == "end":
                op["end"] = r.randint(1, 8) if self.static else {"from_end": r.randint(1, 3)}
            elif kind == "both":
                op["start"] = r.randint(0, 2)
                op["end"] = -r.randint(1, 2)
            elif kind == "from_end":
                op["end"] = {"from_end": r.randint(0, 3)}
            elif kind == "neg_start":
                op["start"] = -r.randint(1, 4)  # the last few steps, whatever the length
            else:
                op["step"] = r.choice([2, 3])
                op["start"] = r.randint(0, 1)
            return self.emit(op)
        axes = [a for a, d in enumerate(shape) if a != t and d > 1]
        if not axes:
            return None
        dim = r.choice(axes)
        size = shape[dim]
        start = r.randrange(size)
        end = r.randint(start + 1, size)
        op = {"op": "slice", "x": cur, "dim": dim, "start": start, "end": end}
        if r.random() < 0.15:
            op["step"] = 2
        return self.emit(op)

    def a_select(self, cur: str) -> str | None:
        r = self.rng
        shape = self.shape(cur)
        if len(shape) < 2:
            return None
        t = self.time_axis(cur)
        axes = [a for a in range(len(shape)) if a != t]
        if t is not None and r.random() < 0.25:
            # The first or last step (a recurrence's new state is y[:, :, -1]).
            index = r.choice([0, -1])
            selected = self.emit({"op": "select", "x": cur, "dim": t, "index": index})
            if selected and r.random() < 0.7:
                return self.emit({"op": "unsqueeze", "x": selected, "dim": t}) or selected
            return selected
        if not axes:
            return None
        dim = r.choice(axes)
        selected = self.emit(
            {"op": "select", "x": cur, "dim": dim, "index": r.randrange(-shape[dim], shape[dim])}
        )
        if not selected:
            return None
        # Put the axis back most of the time, so the chain goes on at rank 3.
        if r.random() < 0.7:
            return self.emit({"op": "unsqueeze", "x": selected, "dim": dim}) or selected
        return selected

    def a_split(self, cur: str) -> str | None:
        r = self.rng
        shape = self.shape(cur)
        t = self.time_axis(cur)
        axes = [a for a, d in enumerate(shape) if a != t and d >= 2]
        if self.static and t is not None and r.random() < 0.2:
            axes = [t]
        if not axes:
            return None
        dim = r.choice(axes)
        size = shape[dim] if dim != t else self.g["time"]
        form = r.choice(["chunk", "chunk", "split", "sizes"])
        op: dict[str, Any] = {"op": "split", "form": form, "x": cur, "dim": dim}
        if form == "chunk":
            op["chunks"] = r.choice([2, 2, 3])
            n = len(range(0, size, math.ceil(size / op["chunks"])))
        elif form == "split":
            op["size"] = r.randint(1, max(1, size - 1))
            n = math.ceil(size / op["size"])
        else:
            cut = r.randint(1, size - 1) if size > 1 else 1
            op["sizes"] = [cut, size - cut] if size > cut else [size]
            n = len(op["sizes"])
        if dim == t and form != "split":
            return None
        pieces = self.emit(op, outs=n)
        if not pieces:
            return None
        if len(pieces) == 1:
            return pieces[0]
        how = r.choice(["glu", "add", "cat", "one"])
        a, b = pieces[0], pieces[1]
        if how == "glu":
            gate = self.emit({"op": "unary", "fn": "sigmoid", "x": b})
            if gate:
                out = self.emit({"op": "binary", "fn": "mul", "a": a, "b": gate})
                if out:
                    return out
        if how == "add":
            out = self.emit({"op": "binary", "fn": "add", "a": a, "b": b})
            if out:
                return out
        if how == "cat":
            order = list(pieces)
            r.shuffle(order)
            out = self.emit({"op": "cat", "xs": order, "dim": dim})
            if out:
                return out
        return r.choice(pieces)

    def a_glu(self, cur: str) -> str | None:
        """``F.glu`` over a static axis of even size (the halves of a split,
        written as one op: RustConv takes it whole or decomposed)."""
        r = self.rng
        shape = self.shape(cur)
        t = self.time_axis(cur)
        even = [a for a in range(len(shape)) if a != t and shape[a] % 2 == 0]
        if not even:
            return None
        dim = r.choice(even)
        if r.random() < 0.3:
            dim -= len(shape)
        return self.emit({"op": "glu", "x": cur, "dim": dim})

    def a_cat(self, cur: str) -> str | None:
        r = self.rng
        shape = self.shape(cur)
        t = self.time_axis(cur)
        if t is not None and r.random() < 0.35:
            # Along time: a learned or fed prefix/suffix of a few steps.
            extra = list(shape)
            extra[t] = r.randint(1, 3)
            other = self.param(extra) if r.random() < 0.6 else self.input(extra)
            xs = [other, cur] if r.random() < 0.6 else [cur, other]
            return self.emit({"op": "cat", "xs": xs, "dim": t})
        axes = [a for a in range(len(shape)) if a != t]
        if not axes:
            return None
        dim = r.choice(axes)
        same = self.acts(cur)
        other = r.choice(same[-3:]) if same and r.random() < 0.6 else None
        if other is None:
            extra = self.probe.time_entries(cur)
            if extra is None:
                return None
            extra[dim] = r.randint(1, 4)
            other = self.input(extra)
        xs = [cur, other] if r.random() < 0.5 else [other, cur]
        if r.random() < 0.2:
            xs.append(cur)
        if r.random() < 0.5:
            dim -= len(shape)
        return self.emit({"op": "cat", "xs": xs, "dim": dim})

    def a_clone(self, cur: str) -> str | None:
        return self.emit(
            {"op": "clone", "x": cur, "form": self.rng.choice(["clone", "contiguous"])}
        )

    def conv_ready(self, cur: str) -> str | None:
        """``cur`` as ``[B, C, T]`` (time last), transposing or squeezing it there."""
        shape = self.shape(cur)
        t = self.time_axis(cur)
        if t is None:
            return None
        if len(shape) == 4:
            ones = [a for a, d in enumerate(shape) if d == 1 and a != t]
            if not ones:
                return None
            cur = self.emit({"op": "squeeze", "x": cur, "dim": ones[0]})
            if not cur:
                return None
            shape, t = self.shape(cur), self.time_axis(cur)
        if len(shape) == 2:
            cur = self.emit({"op": "unsqueeze", "x": cur, "dim": 0})
            if not cur:
                return None
            shape, t = self.shape(cur), self.time_axis(cur)
        if len(shape) != 3:
            return None
        if t != 2:
            cur = self.emit({"op": "transpose", "x": cur, "d0": t, "d1": 2})
            if not cur:
                return None
        if self.shape(cur)[1] > MAX_CHANNELS:
            return None
        return cur

    def weight(self, cout: int, cin_g: int, k: int) -> str:
        """A conv weight ``[cout, cin_g, k]``: a parameter, an input, or computed."""
        r = self.rng
        scale = 1.0 / math.sqrt(cin_g * k)
        recipe = _weighted(
            r,
            {
                "param": 10,
                "input": 2,
                "squeeze_unsqueeze": 2,
                "permute": 2,
                "flip": 1,
                "slice": 1,
                "scaled": 1,
                "weight_norm": 1,
                "unflatten": 1,
                "cast": 1,
                "input_permuted": 1,
            },
        )
        if recipe == "param":
            return self.param([cout, cin_g, k], scale)
        if recipe == "input":
            return self.input([cout, cin_g, k], scale=round(scale, 4))
        if recipe == "squeeze_unsqueeze":
            # transformers' Lfm2ShortConv: conv.weight.squeeze(1).unsqueeze(1).
            if cin_g == 1:
                p = self.param([cout, 1, k], scale)
                w = self.emit({"op": "squeeze", "x": p, "dim": 1})
                out = self.emit({"op": "unsqueeze", "x": w, "dim": 1}) if w else None
            elif r.random() < 0.5:
                p = self.param([cout, 1, cin_g, k], scale)
                out = self.emit({"op": "squeeze", "x": p, "dim": 1})
            else:
                p = self.param([cout, cin_g, k], scale)
                w = self.emit({"op": "unsqueeze", "x": p, "dim": 0})
                out = self.emit({"op": "squeeze", "x": w, "dim": 0}) if w else None
        elif recipe == "permute":
            if r.random() < 0.5:
                p = self.param([k, cin_g, cout], scale)
                out = self.emit({"op": "permute", "x": p, "dims": [2, 1, 0]})
            else:
                p = self.param([cin_g, cout, k], scale)
                out = self.emit({"op": "transpose", "x": p, "d0": 0, "d1": 1})
            if out and r.random() < 0.4:
                out = self.emit({"op": "clone", "x": out, "form": "contiguous"})
        elif recipe == "flip":
            p = self.param([cout, cin_g, k], scale)
            out = self.emit({"op": "flip", "x": p, "dims": [2]})
        elif recipe == "slice":
            if r.random() < 0.5:
                extra = r.randint(1, 3)
                p = self.param([cout + extra, cin_g, k], scale)
                start = r.randint(0, extra)
                out = self.emit(
                    {"op": "slice", "x": p, "dim": 0, "start": start, "end": start + cout}
                )
            else:
                p = self.param([cout, cin_g, k + 2], scale)
                out = self.emit({"op": "slice", "x": p, "dim": 2, "start": 1, "end": k + 1})
        elif recipe == "scaled":
            p = self.param([cout, cin_g, k], scale)
            out = self.emit({"op": "binary", "fn": "mul", "a": p, "b": self.scalar(nonzero=True)})
        elif recipe == "weight_norm":
            # torch.nn.utils.weight_norm: g * v / ||v|| over (cin, k) per output channel.
            v = self.param([cout, cin_g, k], 1.0)
            g = self.param([cout, 1, 1], 1.0, init="positive")
            direction = self.emit({"op": "norm", "x": v, "dims": [1, 2]})
            out = self.emit({"op": "binary", "fn": "mul", "a": g, "b": direction})
        elif recipe == "unflatten":
            p = self.param([cout, cin_g * k], scale)
            out = self.emit({"op": "flatten", "x": p, "dim": 1, "sizes": [cin_g, k]})
        elif recipe == "cast":
            # Stored in the other float dtype, cast where used.
            stored = "float32" if self.g["dtype"] == "float16" else "float16"
            p = self.param([cout, cin_g, k], scale, dtype=stored)
            out = self.emit({"op": "cast", "x": p, "to": self.g["dtype"]})
        else:  # input_permuted
            x = self.input([k, cin_g, cout], scale=round(scale, 4))
            out = self.emit({"op": "permute", "x": x, "dims": [2, 1, 0]})
        return out or self.param([cout, cin_g, k], scale)

    def bias(self, cout: int) -> str | None:
        r = self.rng
        recipe = _weighted(
            r, {"none": 4, "param": 5, "input": 1, "squeeze": 1, "scaled": 1, "slice": 1}
        )
        if recipe == "none":
            return None
        if recipe == "param":
            return self.param([cout], 0.5)
        if recipe == "input":
            return self.input([cout], scale=0.5)
        if recipe == "squeeze":
            p = self.param([cout, 1], 0.5)
            return self.emit({"op": "squeeze", "x": p, "dim": 1}) or self.param([cout], 0.5)
        if recipe == "scaled":
            p = self.param([cout], 0.5)
            return self.emit({"op": "binary", "fn": "mul", "a": p, "b": {"scalar": 2.0}}) or p
        p = self.param([cout + 2], 0.5)
        return self.emit({"op": "slice", "x": p, "dim": 0, "start": 1, "end": cout + 1}) or p

    def conv_shape(self, cin: int) -> tuple[int, int, int, int, int]:
        """(cout, groups, k, stride, dilation)."""
        r = self.rng
        divisors = [d for d in range(1, cin + 1) if cin % d == 0]
        kind = _weighted(r, {"dense": 4, "depthwise": 4, "grouped": 2})
        if kind == "dense" or cin == 1:
            groups = 1
        elif kind == "depthwise":
            groups = cin
        else:
            groups = r.choice(divisors)
        k = _weighted(
            r,
            {
                1: 1,
                2: 2,
                3: 4,
                4: 2,
                5: 1,
                7: 1,
                8: 0.3,
                9: 0.3,
                10: 0.3,
                11: 0.3,
                16: 0.2,
                31: 0.2,
            },
        )
        stride = _weighted(r, {1: 8, 2: 2, 3: 1, 4: 0.5, 5: 0.5})
        dilation = _weighted(r, {1: 8, 2: 2, 3: 1, 4: 0.3})
        top = MAX_CHANNELS if self.big else 16
        if groups == cin:
            cout = cin * r.choice([1, 1, 1, 2])
        else:
            mult = max(1, r.randint(1, top) // groups)
            cout = groups * mult
        return (
            min(cout, max(groups, (MAX_CHANNELS // groups) * groups)),
            groups,
            k,
            stride,
            dilation,
        )

    def a_conv(self, cur: str) -> str | None:
        r = self.rng
        x = self.conv_ready(cur)
        if x is None:
            return None
        cin = self.shape(x)[1]
        cout, groups, k, stride, dilation = self.conv_shape(cin)
        span = dilation * (k - 1)
        w = self.weight(cout, cin // groups, k)
        b = self.bias(cout)
        form = _weighted(
            r,
            {
                "int": 3,
                "same": 2 if stride == 1 else 0,
                "valid": 1,
                "pad": 2,
                "causal_pad": 2,
                "causal_cut": 2 if stride == 1 else 0,
                "pad_mode": 0.5,
            },
        )
        op: dict[str, Any] = {"op": "conv", "x": x, "w": w, "b": b}
        if stride != 1:
            op["stride"] = stride
        if dilation != 1:
            op["dilation"] = dilation
        if groups != 1:
            op["groups"] = groups
        if form == "int":
            op["padding"] = r.randint(0, span) if span else 0
        elif form in ("same", "valid"):
            op["padding"] = form
        elif form == "pad":
            left, right = r.randint(0, span + 1), r.randint(0, span + 1)
            padded = self.emit({"op": "pad", "x": x, "pads": [left, right]})
            if padded:
                op["x"] = padded
        elif form == "causal_pad":
            padded = self.emit({"op": "pad", "x": x, "pads": [span, 0]})
            if padded:
                op["x"] = padded
        elif form == "pad_mode":
            amount = max(1, span // 2)
            # Reflect/replicate/circular pads of a dynamic length fail in
            # ExecuTorch's own kernels (a static output), with or without RustConv.
            mode = r.choice(["reflect", "replicate", "circular"])
            padded = None
            if self.static:
                padded = self.emit({"op": "pad", "x": x, "pads": [amount, amount], "mode": mode})
            if padded:
                op["x"] = padded
            elif r.random() < 0.5:
                padded = self.emit(
                    {"op": "pad", "x": x, "pads": [amount, 0], "value": r.choice([1.0, -0.5])}
                )
                op["x"] = padded or x
        if form == "causal_cut":
            op["padding"] = span
        op = self.layer(op, 0.6)
        if op.get("module") and isinstance(op.get("padding"), int) and op["padding"] > 0:
            if op["x"] == x and self.static and r.random() < 0.15:
                op["padding_mode"] = r.choice(["reflect", "replicate", "circular"])
        if form == "causal_cut":
            # Conv1d(padding=span) then [..., :x.size(-1)] (transformers' LFM2).
            y = self.emit(op)
            if not y:
                return None
            end: Any = {"size_of": x, "dim": 2}
            if self.static and r.random() < 0.3:
                end = self.g["time"] if self.shape(x)[2] == self.g["time"] else end
            return self.emit({"op": "slice", "x": y, "dim": -1, "end": end}) or y
        return self.emit(op)

    def a_conv_transpose(self, cur: str) -> str | None:
        """``ConvTranspose1d``, an upsampler: weight ``[cin, cout / groups, K]``,
        padding up to half its span, output padding below its stride."""
        r = self.rng
        x = self.conv_ready(cur)
        if x is None:
            return None
        cin = self.shape(x)[1]
        cout, groups, k, stride, dilation = self.conv_shape(cin)
        span = dilation * (k - 1)
        op: dict[str, Any] = {
            "op": "conv_transpose",
            "x": x,
            "w": self.weight(cin, cout // groups, k),
            "b": self.bias(cout),
        }
        for key, value, default in (
            ("stride", stride, 1),
            ("dilation", dilation, 1),
            ("groups", groups, 1),
            ("padding", r.randint(0, span // 2), 0),
            ("output_padding", r.randint(0, max(stride, dilation) - 1), 0),
        ):
            if value != default:
                op[key] = value
        return self.emit(self.layer(op, 0.6))

    def a_state_conv(self, cur: str) -> str | None:
        """ExecuTorch's LFM2 ShortConv: cat(state, x) -> conv, state <- last K-1 steps."""
        r = self.rng
        x = self.conv_ready(cur)
        if x is None or self.shape(x)[0] != 1:
            return None
        cin = self.shape(x)[1]
        cout, groups, k, _, dilation = self.conv_shape(cin)
        k = max(k, 2)
        span = dilation * (k - 1)
        state = self.buffer([1, cin, span])
        xs = self.emit({"op": "cat", "xs": [state, x], "dim": r.choice([2, -1])})
        if not xs:
            return None
        start: Any = -span if r.random() < 0.6 else {"from_end": span}
        if isinstance(start, dict):
            new = self.emit({"op": "slice", "x": xs, "dim": 2, "start": start})
        else:
            new = self.emit({"op": "slice", "x": xs, "dim": -1, "start": start})
        if not new or not self.emit({"op": "state_update", "buffer": state, "x": new}):
            return None
        op: dict[str, Any] = {
            "op": "conv",
            "x": xs,
            "w": self.weight(cout, cin // groups, k),
            "b": self.bias(cout),
        }
        if dilation != 1:
            op["dilation"] = dilation
        if groups != 1:
            op["groups"] = groups
        y = self.emit(self.layer(op, 0.5))
        if y and r.random() < 0.3:
            # ExecuTorch's form slices the conv to the input's length anyway.
            return (
                self.emit({"op": "slice", "x": y, "dim": -1, "end": {"size_of": x, "dim": 2}}) or y
            )
        return y

    def decay(self, like: str) -> str | None:
        """A scan's ``a`` in (0, 1): sigmoid(z) or exp(-softplus(z))."""
        r = self.rng
        src = self.operand(like, allow_scalar=False)
        if not isinstance(src, str) or not self.probe.same_shape(src, like):
            src = like
        if r.random() < 0.6:
            return self.emit({"op": "unary", "fn": "sigmoid", "x": src})
        sp = self.emit({"op": "unary", "fn": "softplus", "x": src})
        neg = self.emit({"op": "unary", "fn": "neg", "x": sp}) if sp else None
        return self.emit({"op": "unary", "fn": "exp", "x": neg}) if neg else None

    def a_scan(self, cur: str) -> str | None:
        r = self.rng
        u = self.conv_ready(cur)
        if u is None:
            return None
        a = self.decay(u)
        if a is None:
            return None
        b, c = self.shape(u)[:2]
        stateful = self.stateful and b == 1 and r.random() < 0.7
        if stateful:
            x0 = self.buffer([1, c])
        else:
            kind = r.choice(["param", "input", "select", "zeros"])
            if kind == "param":
                x0 = self.param([b, c])
            elif kind == "input":
                x0 = self.input([b, c])
            elif kind == "select":
                x0 = self.emit({"op": "select", "x": u, "dim": 2, "index": r.choice([0, -1])})
            else:
                first = self.emit({"op": "select", "x": u, "dim": 2, "index": 0})
                x0 = (
                    self.emit({"op": "full_like", "x": first, "form": "zeros_like"})
                    if first
                    else None
                )
            x0 = x0 or self.param([b, c])
        y = self.emit({"op": "scan", "x0": x0, "a": a, "u": u})
        if y and stateful:
            last = self.emit({"op": "select", "x": y, "dim": r.choice([2, -1]), "index": -1})
            if not last or not self.emit({"op": "state_update", "buffer": x0, "x": last}):
                return None
        return y

    def a_foreign(self, cur: str) -> str | None:
        """An op RustConv does not run: a partition boundary."""
        r = self.rng
        kind = _weighted(
            r,
            {
                "linear": 3,
                "matmul": 2,
                "layer_norm": 2,
                "rms_norm": 1,
                "group_norm": 2,
                "batch_norm": 1,
                "softmax": 1,
                "reduce": 1.5,
                "other_unary": 2,
                "pow": 1,
                "cumsum": 1,
                "flip": 1,
                "cast": 1,
                "unflatten": 1,
                "pad": 1,
            },
        )
        shape = self.shape(cur)
        t = self.time_axis(cur)
        if kind in ("linear", "layer_norm", "rms_norm"):
            x = cur
            if t == len(shape) - 1:
                x = self.emit({"op": "transpose", "x": cur, "d0": -1, "d1": -2})
                if not x:
                    return None
            cin = self.shape(x)[-1]
            if kind in ("layer_norm", "rms_norm") and cin < 4:
                # Over 2 or 3 values ExecuTorch's portable layer_norm is off by
                # more than 1e-4 (its variance cancels), with or without RustConv.
                return None
            if kind == "linear":
                cout = r.randint(1, 16)
                w = self.param([cout, cin], 1 / math.sqrt(cin))
                b = self.param([cout], 0.5) if r.random() < 0.6 else None
                return self.emit(self.layer({"op": "linear", "x": x, "w": w, "b": b}, 0.7))
            w = self.param([cin], init="positive") if r.random() < 0.7 else None
            if kind == "rms_norm":
                return self.emit(self.layer({"op": "rms_norm", "x": x, "w": w}, 0.7))
            b = self.param([cin], 0.3) if r.random() < 0.5 else None
            return self.emit(self.layer({"op": "layer_norm", "x": x, "w": w, "b": b}, 0.7))
        if kind == "matmul":
            x = self.conv_ready(cur)
            if x is None:
                return None
            cin = self.shape(x)[1]
            w = self.param([r.randint(1, 16), cin], 1 / math.sqrt(cin))
            return self.emit({"op": "matmul", "a": w, "b": x})
        if kind in ("group_norm", "batch_norm"):
            x = self.conv_ready(cur)
            if x is None:
                return None
            c = self.shape(x)[1]
            w = self.param([c], init="positive") if r.random() < 0.7 else None
            b = self.param([c], 0.3) if r.random() < 0.6 else None
            if kind == "group_norm":
                groups = r.choice([d for d in range(1, c + 1) if c % d == 0])
                op = {"op": "group_norm", "x": x, "groups": groups, "w": w, "b": b}
                return self.emit(self.layer(op, 0.7))
            # Running statistics are buffers (constants: never updated here).
            mean = self.buffer([c], init="normal")
            var = self.buffer([c], init="positive")
            op = {"op": "batch_norm", "x": x, "mean": mean, "var": var, "w": w, "b": b}
            return self.emit(self.layer(op, 0.7))
        static_axes = [a for a in range(len(shape)) if a != t]
        if kind == "softmax" and static_axes:
            return self.emit({"op": "softmax", "x": cur, "dim": r.choice(static_axes)})
        if kind == "reduce" and static_axes:
            fn = r.choice(["mean", "sum", "amax"])
            return self.emit({"op": "reduce", "fn": fn, "x": cur, "dim": r.choice(static_axes)})
        if kind == "pow":
            return self.emit({"op": "pow", "x": cur, "exponent": r.choice([2, 3])})
        if kind == "cumsum" and t is not None:
            return self.emit({"op": "cumsum", "x": cur, "dim": t})
        if kind == "flip" and t is not None:
            return self.emit({"op": "flip", "x": cur, "dims": [t]})
        if kind == "cast":
            other = "float32" if self.g["dtype"] == "float16" else "float16"
            if r.random() < 0.25:
                other = "bfloat16"  # a dtype RustConv does not run
            there = self.emit({"op": "cast", "x": cur, "to": other})
            mid = self.emit({"op": "unary", "fn": "silu", "x": there}) if there else None
            return self.emit({"op": "cast", "x": mid, "to": self.g["dtype"]}) if mid else None
        if kind == "unflatten":
            axes = [a for a in static_axes if shape[a] % 2 == 0 and shape[a] >= 2]
            if axes and len(shape) < 4:
                a = r.choice(axes)
                split = self.emit(
                    {"op": "flatten", "x": cur, "dim": a, "sizes": [2, shape[a] // 2]}
                )
                mid = self.emit({"op": "unary", "fn": "tanh", "x": split}) if split else None
                return self.emit({"op": "flatten", "x": mid, "dim": a}) if mid else None
        if kind == "pad" and t == len(shape) - 1:
            # A pad RustConv does not fold: not zero, or not feeding a conv.
            pads = [r.randint(0, 2), r.randint(1, 2)]
            return self.emit({"op": "pad", "x": cur, "pads": pads, "value": r.choice([0.0, 0.5])})
        fn = r.choice(OTHER_UNARY)
        return self.emit({"op": "other_unary", "fn": fn, "x": cur})


#: Action name -> relative weight in the main chain.
ACTIONS: dict[str, float] = {
    "conv": 5,
    "conv_transpose": 0.5,
    "unary": 4,
    "binary": 5,
    "where": 1.5,
    "mask": 0.7,
    "clamp": 1,
    "transpose": 2,
    "view": 1.5,
    "slice": 2,
    "select": 0.7,
    "split": 1.2,
    "cat": 1.2,
    "glu": 0.6,
    "clone": 0.5,
    "scan": 1.5,
    "foreign": 2.5,
}


def generate_graph(
    seed: int,
    mode: str = "static",
    calls: list[int] | None = None,
    *,
    time: int | None = None,
    tmin: int | None = None,
    tmax: int | None = None,
    dtype: str | None = None,
    steps: int | None = None,
) -> dict:
    """One random graph; deterministic in its arguments."""
    r = random.Random(seed)
    big = r.random() < 0.12
    if dtype is None:
        dtype = "float16" if r.random() < 0.2 else "float32"
    if time is None:
        time = r.choice([r.randint(4, 24), r.randint(4, 24), r.randint(25, 80)])
        if big:
            time = r.randint(64, 600)
    if mode == "static":
        calls, tmin, tmax = [time], time, time
    elif mode == "dynamic":
        tmin = tmin if tmin is not None else r.choice([1, 2, 4, 8])
        tmax = tmax if tmax is not None else max(time * 4, 64)
        if calls is None:
            calls = [r.randint(tmin, tmax), r.choice([tmin, tmax, r.randint(tmin, tmax)])]
    else:
        tmin, tmax = 1, tmax or max(time * 4, 64)
        if calls is None:
            calls = [r.randint(2, 12), 1, 1]
    # The example length lies in the Dim's range and is not 1 (torch.export
    # specialises a size of 1).
    time = min(max(time, tmin, 2), tmax)
    graph: dict[str, Any] = {
        "seed": seed,
        "mode": mode,
        "dtype": dtype,
        "time": time,
        "tmin": tmin,
        "tmax": tmax,
        "calls": list(calls),
        "inputs": {},
        "params": {},
        "buffers": {},
        "ops": [],
        "outputs": [],
    }
    gen = GraphGen(r, graph, big)
    batch = 1 if mode == "stateful" or r.random() < 0.8 else 2
    channels = r.choice([1, 2, 3, 4, 4, 6, 8, 8, 12, 16])
    if big:
        channels = r.choice([16, 32, 48, 64])
    layout = "BCT" if r.random() < 0.75 else "BTC"
    shape = [batch, channels, "T"] if layout == "BCT" else [batch, "T", channels]
    cur = gen.input(shape)

    steps = steps if steps is not None else r.randint(2, 7)
    plan = [_weighted(r, ACTIONS) for _ in range(steps)]
    anchor = "scan" if r.random() < 0.15 else "conv"
    if mode == "stateful" and r.random() < 0.8:
        anchor = "state_conv" if r.random() < 0.6 else "scan"
    if not any(a in ("conv", "scan") for a in plan) or anchor != "conv":
        plan.insert(r.randint(0, len(plan)), anchor)
    for action in plan:
        fn: Callable[[str], Any] = getattr(gen, f"a_{action}")
        new = None
        for _ in range(3):  # an action may not apply; try it again, then move on
            new = fn(cur)
            if new:
                break
        if isinstance(new, str):
            cur = new
    outputs = [cur]
    acts = [a for a in gen.acts() if a != cur and a not in graph["inputs"]]
    if acts and r.random() < 0.3:
        outputs.append(r.choice(acts))
    graph["outputs"] = outputs
    return prune(graph)


def prune(graph: dict) -> dict:
    """Drops ops (and leaves) nothing reads; state updates are always kept."""
    live = set(graph["outputs"])
    kept = []
    for op in reversed(graph["ops"]):
        outs = op.get("outs") or ([op["out"]] if "out" in op else [])
        if op["op"] == "state_update" or any(o in live for o in outs):
            kept.append(op)
            live.update(operands(op))
            if op["op"] == "state_update":
                live.add(op["buffer"])
    graph["ops"] = list(reversed(kept))
    for kind in ("inputs", "params", "buffers"):
        graph[kind] = {k: v for k, v in graph[kind].items() if k in live}
    return graph


def program_mode(r: random.Random) -> str:
    return _weighted(r, {"static": 5, "dynamic": 3, "stateful": 2})


def generate_program(seed: int, graphs: int = 8, mode: str | None = None) -> dict:
    """A program of ``graphs`` independent random graphs sharing one call pattern."""
    r = random.Random(seed)
    mode = mode or program_mode(r)
    if mode == "dynamic":
        ncalls = r.choice([1, 2, 2])
    elif mode == "stateful":
        ncalls = r.choice([3, 3, 4])
    else:
        ncalls = 1
    out = []
    for _ in range(graphs):
        gseed = r.getrandbits(40)
        g = random.Random(gseed)
        calls = None
        if mode == "dynamic":
            tmin = g.choice([1, 2, 4, 8])
            tmax = g.choice([64, 256, 2048])
            calls = [g.randint(tmin, min(tmax, 300)) for _ in range(ncalls)]
            graph = generate_graph(gseed, mode, calls, tmin=tmin, tmax=tmax)
        elif mode == "stateful":
            calls = [g.randint(2, 12)] + [1] * (ncalls - 1)
            if ncalls == 4 and g.random() < 0.5:
                calls[1] = g.randint(2, 6)  # a second prefill chunk
            graph = generate_graph(gseed, mode, calls)
        else:
            graph = generate_graph(gseed, mode)
        out.append(graph)
    return {
        "version": 1,
        "seed": seed,
        "mode": mode,
        "threads": r.choice([1, 2, 2, 3]),
        "graphs": out,
    }
