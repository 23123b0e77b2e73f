"""What each op of a spec computes, in torch.

One function per op kind, ``fn(op, args, ctx) -> tensor | list[tensor] | None``:
``op`` is the op's JSON dict, ``args`` its tensor operands resolved by name
(in the order :func:`operands` lists them), ``ctx`` an :class:`OpContext`.
The same functions run in the eager model, in the float64 reference, on meta
tensors while generating (so every shape the generator records is the shape
torch computes) and under ``torch.export``; a spec is therefore valid exactly
when these functions accept it.

Operands of an op are value names (``str``), or a number (``{"scalar": 0.5}``,
folded by torch into a ``*.Scalar`` op or a lifted 0-d constant).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["KINDS", "OpContext", "operands", "run_op", "DTYPES", "RUSTCONV_KINDS"]

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}


@dataclass
class OpContext:
    """What an op needs besides its operands."""

    #: The dtype values of the sub-graph are computed in (float64 for the reference).
    dtype: torch.dtype
    #: True for the float64 reference: a cast to float16 rounds and comes back.
    reference: bool = False
    #: The module, for buffers updated in place (state_update).
    module: torch.nn.Module | None = None
    #: Buffer name -> the module attribute holding it.
    buffers: dict[str, str] | None = None
    #: Where set (the reference), each comparison appends how close its
    #: operands came to each other: a result within rounding of a threshold
    #: may flip in any implementation, so such a model tests nothing.
    margins: list[float] | None = None
    #: Op output name -> the ``nn.Module`` that computes it (ops marked
    #: ``"module": true``); without it (probes) the functional form runs,
    #: which computes the same.
    modules: dict[str, torch.nn.Module] | None = None


def _module(op: dict, ctx: OpContext) -> torch.nn.Module | None:
    if op.get("module") and ctx.modules is not None:
        return ctx.modules[op["out"]]
    return None


def operands(op: dict) -> list[str]:
    """The value names ``op`` reads, in the order its function receives them."""
    names = []
    for key in _OPERAND_KEYS.get(op["op"], ()):
        arg = op.get(key)
        if isinstance(arg, str):
            names.append(arg)
        elif isinstance(arg, list):
            names.extend(a for a in arg if isinstance(a, str))
    return names


def _operand_keys() -> dict[str, tuple[str, ...]]:
    unary = ("x",)
    return {
        "unary": unary,
        "binary": ("a", "b"),
        "where": ("ca", "cb", "x", "y"),
        "mask": ("a", "b"),
        "clamp": unary,
        "full_like": unary,
        "permute": unary,
        "transpose": unary,
        "slice": ("x", "size_of"),
        "select": unary,
        "split": unary,
        "cat": ("xs",),
        "unsqueeze": unary,
        "squeeze": unary,
        "view": unary,
        "flatten": unary,
        "clone": unary,
        "cast": unary,
        "flip": unary,
        "pad": unary,
        "conv": ("x", "w", "b"),
        "conv_transpose": ("x", "w", "b"),
        "scan": ("x0", "a", "u"),
        "linear": ("x", "w", "b"),
        "matmul": ("a", "b"),
        "layer_norm": ("x", "w", "b"),
        "group_norm": ("x", "w", "b"),
        "batch_norm": ("x", "mean", "var", "w", "b"),
        "softmax": unary,
        "reduce": unary,
        "norm": unary,
        "pow": unary,
        "other_unary": unary,
        "cumsum": unary,
        "glu": unary,
        "rms_norm": ("x", "w"),
        "state_update": unary,
    }


_OPERAND_KEYS = _operand_keys()


def run_op(op: dict, env: dict[str, Any], ctx: OpContext) -> Any:
    """Runs one op, reading operands from ``env`` (value name -> tensor)."""
    fn = KINDS[op["op"]]
    return fn(op, env, ctx)


def _v(env: dict[str, Any], arg: Any) -> Any:
    """A value by name, or the number of a ``{"scalar": x}`` operand."""
    if isinstance(arg, str):
        return env[arg]
    if isinstance(arg, dict) and "scalar" in arg:
        return float(arg["scalar"])
    if arg is None:
        return None
    raise ValueError(f"bad operand {arg!r}")


def _guard(x: Any, guard: str | None) -> Any:
    """A domain guard written into the model (the graph shows its ops)."""
    if guard is None or not torch.is_tensor(x):
        return x
    if guard == "abs1":  # > 0, for log, sqrt, rsqrt, reciprocal, div
        return x.abs() + 1.0
    if guard == "abs_half":
        return x.abs() + 0.5
    if guard == "tanh":  # bounded, for exp
        return torch.tanh(x)
    if guard == "sigmoid_half":  # in (0.5, 1.5), for div
        return torch.sigmoid(x) + 0.5
    raise ValueError(f"unknown guard {guard!r}")


_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "exp": torch.exp,
    "log": torch.log,
    "log1p": torch.log1p,
    "softplus": F.softplus,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "elu": F.elu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    # A constant weight of one value (the module form: one per channel).
    "prelu": lambda x: F.prelu(x, torch.tensor([-0.25], dtype=x.dtype)),
    "sin": torch.sin,
    "cos": torch.cos,
}
#: Unary ops RustConv does not run (partition boundaries).
_OTHER_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "erf": torch.erf,
    "square": torch.square,
    "hardswish": F.hardswish,
}


def _unary(op, env, ctx):
    x = _guard(_v(env, op["x"]), op.get("guard"))
    module = _module(op, ctx)
    return module(x) if module is not None else _UNARY[op["fn"]](x)


def _other_unary(op, env, ctx):
    return _OTHER_UNARY[op["fn"]](_v(env, op["x"]))


def _binary(op, env, ctx):
    a, b = _v(env, op["a"]), _v(env, op["b"])
    b = _guard(b, op.get("guard"))
    fn = op["fn"]
    if fn == "add":
        alpha = op.get("alpha")
        return torch.add(a, b, alpha=alpha) if alpha is not None else a + b
    if fn == "sub":
        return a - b
    if fn == "mul":
        return a * b
    if fn == "div":
        return a / b
    if fn == "maximum":
        return torch.maximum(a, b)
    if fn == "minimum":
        return torch.minimum(a, b)
    raise ValueError(f"unknown binary {fn!r}")


_CMP = {
    "gt": torch.gt,
    "ge": torch.ge,
    "lt": torch.lt,
    "le": torch.le,
    "eq": torch.eq,
    "ne": torch.ne,
}


_SWAPPED = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge", "eq": "eq", "ne": "ne"}


def _compare(op, env, ctx, ca="a", cb="b"):
    a, b = _v(env, op[ca]), _v(env, op[cb])
    cmp = op["cmp"]
    if not torch.is_tensor(a):  # 0.5 < x: the tensor goes first, the comparison turns
        a, b = b, a
        cmp = _SWAPPED[cmp]
    if ctx.margins is not None and a.numel() and not a.is_meta:
        # Exact ties (relu's zeros, a clamp's bound against itself) are exact
        # everywhere; only near misses can flip.
        gaps = (a - b).abs()
        gaps = gaps[gaps > 0]
        if gaps.numel():
            ctx.margins.append(float(gaps.min()))
    return _CMP[cmp](a, b)


def _where(op, env, ctx):
    cond = _compare(op, env, ctx, "ca", "cb")
    out = torch.where(cond, _v(env, op["x"]), _v(env, op["y"]))
    if ctx.reference and out.is_floating_point():
        # Between two Python scalars torch picks its default dtype (float32,
        # what the model computes); the reference stays float64 (exact).
        out = out.to(torch.float64)
    return out


def _mask(op, env, ctx):
    cond = _compare(op, env, ctx)
    like = _v(env, op["a"]) if isinstance(op["a"], str) else _v(env, op["b"])
    return cond.to(like.dtype)


def _clamp(op, env, ctx):
    x = _v(env, op["x"])
    form = op.get("form", "clamp")
    lo, hi = op.get("min"), op.get("max")
    if form == "clamp_min":
        return torch.clamp_min(x, lo)
    if form == "clamp_max":
        return torch.clamp_max(x, hi)
    if form == "hardtanh":
        return F.hardtanh(x, lo, hi)
    return torch.clamp(x, lo, hi)


def _full_like(op, env, ctx):
    x = _v(env, op["x"])
    form = op.get("form", "full_like")
    if form == "zeros_like":
        return torch.zeros_like(x)
    if form == "ones_like":
        return torch.ones_like(x)
    return torch.full_like(x, op["fill"])


def _permute(op, env, ctx):
    return _v(env, op["x"]).permute(*op["dims"])


def _transpose(op, env, ctx):
    return _v(env, op["x"]).transpose(op["d0"], op["d1"])


def _bound(b: Any, x: torch.Tensor, dim: int, env) -> Any:
    """A slice bound: an int, or a length read at run time minus an int."""
    if isinstance(b, dict):
        if "size_of" in b:  # another value's length: conv(x)[..., : x.size(-1)]
            return env[b["size_of"]].size(b["dim"]) - b.get("minus", 0)
        return x.size(dim) - b["from_end"]  # x[..., : x.size(-1) - c]
    return b


def _slice(op, env, ctx):
    x = _v(env, op["x"])
    dim = op["dim"] % x.dim()
    start = _bound(op.get("start"), x, dim, env)
    end = _bound(op.get("end"), x, dim, env)
    index = [slice(None)] * x.dim()
    index[dim] = slice(start, end, op.get("step", 1))
    return x[tuple(index)]


def _select(op, env, ctx):
    return _v(env, op["x"]).select(op["dim"], op["index"])


def _split(op, env, ctx):
    x = _v(env, op["x"])
    form = op["form"]
    if form == "chunk":
        pieces = torch.chunk(x, op["chunks"], dim=op["dim"])
    elif form == "split":
        pieces = torch.split(x, op["size"], dim=op["dim"])
    else:
        pieces = torch.split(x, op["sizes"], dim=op["dim"])
    return list(pieces)


def _cat(op, env, ctx):
    return torch.cat([_v(env, name) for name in op["xs"]], dim=op["dim"])


def _unsqueeze(op, env, ctx):
    return _v(env, op["x"]).unsqueeze(op["dim"])


def _squeeze(op, env, ctx):
    return _v(env, op["x"]).squeeze(op["dim"])


def _view(op, env, ctx):
    """``x.view`` inserting (``insert``) or removing (``remove``) a size-1 dim."""
    x = _v(env, op["x"])
    shape = list(x.shape)
    if "insert" in op:
        shape.insert(op["insert"], 1)
    else:
        del shape[op["remove"]]
    return x.view(*shape) if op.get("form", "view") == "view" else x.reshape(*shape)


def _flatten(op, env, ctx):
    """Merges dims ``start..start+1`` (``unflatten`` with ``sizes`` splits one)."""
    x = _v(env, op["x"])
    if "sizes" in op:
        return x.unflatten(op["dim"], op["sizes"])
    return x.flatten(op["dim"], op["dim"] + 1)


def _clone(op, env, ctx):
    x = _v(env, op["x"])
    return x.contiguous() if op.get("form") == "contiguous" else x.clone()


def _cast(op, env, ctx):
    x = _v(env, op["x"])
    to = DTYPES[op["to"]]
    if ctx.reference:
        # The reference stays float64, rounding where the model would.
        return x.to(to).to(torch.float64)
    return x.to(to)


def _flip(op, env, ctx):
    return _v(env, op["x"]).flip(op["dims"])


def _pad(op, env, ctx):
    x = _v(env, op["x"])
    mode = op.get("mode", "constant")
    if mode == "constant":
        return F.pad(x, op["pads"], value=op.get("value", 0.0))
    return F.pad(x, op["pads"], mode=mode)


def _conv(op, env, ctx):
    x, w, b = _v(env, op["x"]), _v(env, op["w"]), _v(env, op.get("b"))
    padding = op.get("padding", 0)
    module = _module(op, ctx)
    if module is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return module(x)
    mode = op.get("padding_mode", "zeros")
    if mode != "zeros":  # what nn.Conv1d does with a padding_mode
        x, padding = F.pad(x, (padding, padding), mode=mode), 0
    with warnings.catch_warnings():
        # "padding='same' with even kernel lengths ... zero-padded copy": as meant.
        warnings.simplefilter("ignore", UserWarning)
        return F.conv1d(
            x,
            w,
            b,
            stride=op.get("stride", 1),
            padding=padding,
            dilation=op.get("dilation", 1),
            groups=op.get("groups", 1),
        )


def _conv_transpose(op, env, ctx):
    x, w, b = _v(env, op["x"]), _v(env, op["w"]), _v(env, op.get("b"))
    module = _module(op, ctx)
    if module is not None:
        return module(x)
    return F.conv_transpose1d(
        x,
        w,
        b,
        stride=op.get("stride", 1),
        padding=op.get("padding", 0),
        output_padding=op.get("output_padding", 0),
        groups=op.get("groups", 1),
        dilation=op.get("dilation", 1),
    )


def _scan(op, env, ctx):
    import rustconv.ops  # noqa: F401  (registers torch.ops.rustconv.linear_scan)

    return torch.ops.rustconv.linear_scan(_v(env, op["x0"]), _v(env, op["a"]), _v(env, op["u"]))


def _linear(op, env, ctx):
    module = _module(op, ctx)
    if module is not None:
        return module(_v(env, op["x"]))
    return F.linear(_v(env, op["x"]), _v(env, op["w"]), _v(env, op.get("b")))


def _matmul(op, env, ctx):
    return torch.matmul(_v(env, op["a"]), _v(env, op["b"]))


def _layer_norm(op, env, ctx):
    x = _v(env, op["x"])
    module = _module(op, ctx)
    if module is not None:
        return module(x)
    return F.layer_norm(
        x, (x.shape[-1],), _v(env, op.get("w")), _v(env, op.get("b")), op.get("eps", 1e-5)
    )


def _group_norm(op, env, ctx):
    module = _module(op, ctx)
    if module is not None:
        return module(_v(env, op["x"]))
    return F.group_norm(
        _v(env, op["x"]), op["groups"], _v(env, op.get("w")), _v(env, op.get("b")), 1e-5
    )


def _batch_norm(op, env, ctx):
    module = _module(op, ctx)
    if module is not None:
        return module(_v(env, op["x"]))
    return F.batch_norm(
        _v(env, op["x"]),
        _v(env, op["mean"]),
        _v(env, op["var"]),
        _v(env, op.get("w")),
        _v(env, op.get("b")),
        training=False,
        eps=1e-5,
    )


def _softmax(op, env, ctx):
    return torch.softmax(_v(env, op["x"]), dim=op["dim"])


def _reduce(op, env, ctx):
    x = _v(env, op["x"])
    fn = {"mean": torch.mean, "sum": torch.sum, "amax": torch.amax}[op["fn"]]
    return fn(x, dim=op["dim"], keepdim=op.get("keepdim", True))


def _norm(op, env, ctx):
    """``v / ||v||`` over ``dims`` (weight normalisation's direction)."""
    x = _v(env, op["x"])
    return x / torch.linalg.vector_norm(x, dim=op["dims"], keepdim=True)


def _pow(op, env, ctx):
    return torch.pow(_v(env, op["x"]), op["exponent"])


def _glu(op, env, ctx):
    return F.glu(_v(env, op["x"]), dim=op["dim"])


def _rms_norm(op, env, ctx):
    x = _v(env, op["x"])
    module = _module(op, ctx)
    if module is not None:
        return module(x)
    return F.rms_norm(x, (x.shape[-1],), _v(env, op.get("w")), op.get("eps", 1e-6))


def _cumsum(op, env, ctx):
    return torch.cumsum(_v(env, op["x"]), dim=op["dim"])


def _state_update(op, env, ctx):
    assert ctx.module is not None and ctx.buffers is not None
    buffer = ctx.module
    for part in ctx.buffers[op["buffer"]].split("."):
        buffer = getattr(buffer, part)
    with torch.no_grad():
        buffer.copy_(_v(env, op["x"]))
    return None


_UNARY_MODULES: dict[str, Callable[[], torch.nn.Module]] = {
    "relu": torch.nn.ReLU,
    "sigmoid": torch.nn.Sigmoid,
    "tanh": torch.nn.Tanh,
    "silu": torch.nn.SiLU,
    "gelu": torch.nn.GELU,
    "gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
    "softplus": torch.nn.Softplus,
    "hardtanh": torch.nn.Hardtanh,
    "relu6": torch.nn.ReLU6,
    "elu": torch.nn.ELU,
    "leaky_relu": lambda: torch.nn.LeakyReLU(0.1),
    "prelu": lambda: torch.nn.PReLU(init=0.3),
}


def module_kinds(op: dict) -> bool:
    """Whether ``op`` may be computed by an ``nn.Module`` (``"module": true``)."""
    kind = op["op"]
    if kind == "unary":
        return op["fn"] in _UNARY_MODULES
    if kind in ("conv", "conv_transpose", "linear"):
        return True
    if kind in ("layer_norm", "rms_norm"):
        return op.get("w") is not None
    if kind == "group_norm":
        return op.get("w") is not None and op.get("b") is not None
    if kind == "batch_norm":
        return (op.get("w") is None) == (op.get("b") is None)
    return False


def build_module(
    op: dict, leaves: dict[str, torch.Tensor]
) -> tuple[torch.nn.Module, dict[str, str]]:
    """The ``nn.Module`` computing ``op``, holding its parameter leaves; and
    which leaves it took (they belong to it alone) as which of its attributes.

    Upstream models call layers, not functions: torch.export records the
    module in each node's ``nn_module_stack`` and ``source_fn_stack``, which
    partitioners and passes group nodes by (XNNPACK's linear and conv
    passes), so a model written with modules can lower differently from the
    same math written with ``torch.nn.functional``.
    """
    kind = op["op"]
    nn = torch.nn

    def take(key: str) -> torch.Tensor | None:
        name = op.get(key)
        return None if name is None else leaves[name]

    attrs = {"w": "weight", "b": "bias", "mean": "running_mean", "var": "running_var"}
    taken = {op[k]: a for k, a in attrs.items() if isinstance(op.get(k), str)}
    if kind == "unary":
        return _UNARY_MODULES[op["fn"]](), {}
    if kind == "conv":
        w, b = take("w"), take("b")
        cout, cin_g, k = w.shape
        groups = op.get("groups", 1)
        module: nn.Module = nn.Conv1d(
            cin_g * groups,
            cout,
            k,
            stride=op.get("stride", 1),
            padding=op.get("padding", 0),
            dilation=op.get("dilation", 1),
            groups=groups,
            bias=b is not None,
            padding_mode=op.get("padding_mode", "zeros"),
        )
    elif kind == "conv_transpose":
        w, b = take("w"), take("b")
        cin, cout_g, k = w.shape
        groups = op.get("groups", 1)
        module = nn.ConvTranspose1d(
            cin,
            cout_g * groups,
            k,
            stride=op.get("stride", 1),
            padding=op.get("padding", 0),
            output_padding=op.get("output_padding", 0),
            groups=groups,
            bias=b is not None,
            dilation=op.get("dilation", 1),
        )
    elif kind == "linear":
        w, b = take("w"), take("b")
        module = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    elif kind == "layer_norm":
        w, b = take("w"), take("b")
        module = nn.LayerNorm(w.shape[0], eps=op.get("eps", 1e-5), bias=b is not None)
    elif kind == "rms_norm":
        w, b = take("w"), None
        module = nn.RMSNorm(w.shape[0], eps=op.get("eps", 1e-6))
    elif kind == "group_norm":
        w, b = take("w"), take("b")
        module = nn.GroupNorm(op["groups"], w.shape[0], eps=1e-5)
    elif kind == "batch_norm":
        w, b = take("w"), take("b")
        mean, var = take("mean"), take("var")
        module = nn.BatchNorm1d(mean.shape[0], eps=1e-5, affine=w is not None).eval()
        module.running_mean.copy_(mean)
        module.running_var.copy_(var)
    else:
        raise ValueError(f"no module for {kind}")
    if w is not None:
        module.weight = nn.Parameter(w.clone())
    if b is not None:
        module.bias = nn.Parameter(b.clone())
    dtype = (w if w is not None else b).dtype if (w is not None or b is not None) else None
    if kind == "batch_norm":
        dtype = mean.dtype
    if dtype is not None:
        module.to(dtype)
    return module, taken


KINDS: dict[str, Callable[[dict, dict, OpContext], Any]] = {
    "unary": _unary,
    "other_unary": _other_unary,
    "binary": _binary,
    "where": _where,
    "mask": _mask,
    "clamp": _clamp,
    "full_like": _full_like,
    "permute": _permute,
    "transpose": _transpose,
    "slice": _slice,
    "select": _select,
    "split": _split,
    "cat": _cat,
    "unsqueeze": _unsqueeze,
    "squeeze": _squeeze,
    "view": _view,
    "flatten": _flatten,
    "clone": _clone,
    "cast": _cast,
    "flip": _flip,
    "pad": _pad,
    "conv": _conv,
    "conv_transpose": _conv_transpose,
    "scan": _scan,
    "linear": _linear,
    "matmul": _matmul,
    "layer_norm": _layer_norm,
    "group_norm": _group_norm,
    "batch_norm": _batch_norm,
    "softmax": _softmax,
    "reduce": _reduce,
    "norm": _norm,
    "pow": _pow,
    "cumsum": _cumsum,
    "glu": _glu,
    "rms_norm": _rms_norm,
    "state_update": _state_update,
}

#: Op kinds RustConv's partitioner claims (the rest are partition boundaries);
#: used for statistics only.
RUSTCONV_KINDS = frozenset(
    {
        "unary",
        "binary",
        "where",
        "mask",
        "clamp",
        "full_like",
        "permute",
        "transpose",
        "slice",
        "select",
        "split",
        "cat",
        "unsqueeze",
        "squeeze",
        "view",
        "clone",
        "pad",
        "conv",
        "conv_transpose",
        "scan",
    }
)
