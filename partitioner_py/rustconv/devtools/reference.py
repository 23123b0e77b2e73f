"""A slow, obviously-correct interpreter for RustConv blobs, built on torch.

It executes a blob exactly as the schema describes it (values by index,
nodes in order, explicit left/right padding, NumPy broadcasting, scalar
operands at index -1, Python-style slice bounds evaluated against the run-time
size, reshapes that pair the non-unit dimensions in order, constants read
from the segment), so tests can check that ``preprocess`` preserved the
meaning of the subgraph, and the runtime can be compared against it when
debugging. It ignores ``Node.kernel``: fusion must not change results. Each
node computes in float32 and rounds its result to the value's dtype (the
runtime computes float16 tensors in float32 too). It is not used on any export
or inference path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rustconv.export.blob import read_blob
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.DType import DType
from rustconv.fb.Graph import GraphT
from rustconv.fb.Op import Op
from rustconv.fb.ReduceOp import ReduceOp
from rustconv.fb.UnaryOp import UnaryOp
from rustconv.fb.ValueKind import ValueKind
from rustconv.ops import linear_scan

__all__ = ["run_blob"]

_TORCH_DTYPES = {DType.Float32: torch.float32, DType.Float16: torch.float16}
_NUMPY_DTYPES = {DType.Float32: "<f4", DType.Float16: "<f2"}

_UNARY: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    UnaryOp.Identity: lambda x: x.clone(),
    UnaryOp.Neg: torch.neg,
    UnaryOp.Abs: torch.abs,
    UnaryOp.Relu: torch.relu,
    UnaryOp.Sigmoid: torch.sigmoid,
    UnaryOp.Tanh: torch.tanh,
    UnaryOp.Silu: F.silu,
    UnaryOp.Gelu: F.gelu,
    UnaryOp.GeluTanh: lambda x: F.gelu(x, approximate="tanh"),
    UnaryOp.Exp: torch.exp,
    UnaryOp.Log: torch.log,
    UnaryOp.Log1p: torch.log1p,
    UnaryOp.Softplus: F.softplus,
    UnaryOp.Sqrt: torch.sqrt,
    UnaryOp.Rsqrt: torch.rsqrt,
    UnaryOp.Reciprocal: torch.reciprocal,
    UnaryOp.Sin: torch.sin,
    UnaryOp.Cos: torch.cos,
}

_BINARY: dict[int, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    BinaryOp.Add: torch.add,
    BinaryOp.Sub: torch.sub,
    BinaryOp.Mul: torch.mul,
    BinaryOp.Div: torch.div,
    BinaryOp.Maximum: torch.maximum,
    BinaryOp.Minimum: torch.minimum,
    BinaryOp.Gt: torch.gt,
    BinaryOp.Ge: torch.ge,
    BinaryOp.Lt: torch.lt,
    BinaryOp.Le: torch.le,
    BinaryOp.Eq: torch.eq,
    BinaryOp.Ne: torch.ne,
}

_REDUCE: dict[int, Callable[[torch.Tensor, list[int]], torch.Tensor]] = {
    ReduceOp.Sum: lambda x, dims: x.sum(dims, keepdim=True),
    ReduceOp.Mean: lambda x, dims: x.mean(dims, keepdim=True),
    ReduceOp.Var: lambda x, dims: x.var(dims, correction=0, keepdim=True),
}


def run_blob(blob: bytes, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Runs ``blob`` on ``inputs`` (in delegate-input order); returns its outputs."""
    parsed = read_blob(blob)
    graph = GraphT.InitFromObj(parsed.graph)
    values = graph.values or []
    inputs_list = [int(i) for i in (graph.inputs if graph.inputs is not None else [])]
    outputs_list = [int(i) for i in (graph.outputs if graph.outputs is not None else [])]
    if len(inputs) != len(inputs_list):
        raise ValueError(f"blob takes {len(inputs_list)} inputs, got {len(inputs)}")

    env = _Env({}, values)
    for index, value in enumerate(values):
        if value.kind in (ValueKind.Constant, ValueKind.State):  # a state: its initial value
            raw = parsed.segment[value.constantOffset : value.constantOffset + value.constantSize]
            shape = [d.size for d in value.dims]
            array = np.frombuffer(raw, dtype=_NUMPY_DTYPES[value.dtype]).reshape(shape)
            env.tensors[index] = torch.from_numpy(array.copy())
    for position, index in enumerate(inputs_list):
        value = values[index]
        tensor = inputs[position]
        if tensor.dim() != len(value.dims):
            raise ValueError(f"input {position} is {tensor.dim()}-D, expected {len(value.dims)}-D")
        for dim, size in zip(value.dims, tensor.shape, strict=True):
            ok = size <= dim.size if dim.dynamic else size == dim.size
            if not ok:
                raise ValueError(f"input {position} has shape {tuple(tensor.shape)}")
        env.tensors[index] = tensor.to(_TORCH_DTYPES[value.dtype]).contiguous()

    for node in graph.nodes or []:
        op = node.op
        result = _run_node(node.opType, op, env, node.name)
        env.tensors[op.output] = result.to(_TORCH_DTYPES[values[op.output].dtype]).contiguous()
    return [env.tensors[i] for i in outputs_list]


class _Env:
    """The tensors computed so far, by value index, and the blob's values."""

    def __init__(self, tensors: dict[int, torch.Tensor], values) -> None:
        self.tensors = tensors
        self.values = values

    def read(self, index: int) -> torch.Tensor:
        return self.tensors[index].float()

    def operand(self, index: int, scalar: float) -> torch.Tensor:
        """A value, or the scalar beside it where the index is -1."""
        return self.read(index) if index >= 0 else torch.tensor(scalar, dtype=torch.float32)


def _conv1d(op, env: _Env) -> torch.Tensor:
    x = F.pad(env.read(op.input), (op.padLeft, op.padRight))
    bias = None if op.bias < 0 else env.read(op.bias)
    return F.conv1d(x, env.read(op.weight), bias, op.stride, 0, op.dilation, op.groups)


def _binary(op, env: _Env) -> torch.Tensor:
    result = _BINARY[op.op](env.operand(op.a, op.aScalar), env.operand(op.b, op.bScalar))
    return result.float()  # comparisons: 1.0 / 0.0


def _where(op, env: _Env) -> torch.Tensor:
    cond = env.read(op.cond) != 0
    return torch.where(cond, env.operand(op.a, op.aScalar), env.operand(op.b, op.bScalar))


def _clamp(op, env: _Env) -> torch.Tensor:
    low = op.min if op.hasMin else None
    high = op.max if op.hasMax else None
    x = env.read(op.input)
    return x.clone() if low is None and high is None else torch.clamp(x, low, high)


def _slice(op, env: _Env) -> torch.Tensor:
    index = (slice(None),) * op.dim + (slice(op.start, op.end, op.step),)
    return env.read(op.input)[index]


def _reshape(op, env: _Env) -> torch.Tensor:
    shape = _reshaped(env.tensors[op.input].shape, env.values[op.input], env.values[op.output])
    return env.read(op.input).reshape(shape)


#: Every blob op kind (the schema's ``Op`` union), by its tag.
_NODES: dict[int, Callable[[object, _Env], torch.Tensor]] = {
    Op.Conv1d: _conv1d,
    Op.LinearScan: lambda op, env: linear_scan(env.read(op.x0), env.read(op.a), env.read(op.u)),
    Op.Unary: lambda op, env: _UNARY[op.op](env.read(op.input)),
    Op.Binary: _binary,
    Op.Where: _where,
    Op.Clamp: _clamp,
    Op.Full: lambda op, env: torch.full(env.tensors[op.like].shape, op.value, dtype=torch.float32),
    Op.Permute: lambda op, env: env.read(op.input).permute([int(p) for p in op.perm]),
    Op.Slice: _slice,
    Op.Reshape: _reshape,
    Op.Cat: lambda op, env: torch.cat([env.read(i) for i in op.inputs], dim=op.dim),
    Op.Reduce: lambda op, env: _REDUCE[op.op](env.read(op.input), [int(d) for d in op.dims]),
}


def _run_node(op_type: int, op, env: _Env, name) -> torch.Tensor:
    run = _NODES.get(op_type)
    if run is None:
        raise ValueError(f"unknown op type {op_type} in node {name!r}")
    return run(op, env)


def _unit(dim) -> bool:
    return dim.size == 1 and not dim.dynamic


def _reshaped(actual: torch.Size, source, target) -> list[int]:
    """The output shape: the input's non-unit sizes, in order, into the output's
    non-unit dimensions (schema: ``Reshape`` only removes or inserts 1s)."""
    sizes = iter(size for size, dim in zip(actual, source.dims, strict=True) if not _unit(dim))
    shape = [1 if _unit(dim) else next(sizes) for dim in target.dims]
    if next(sizes, None) is not None:
        raise ValueError("reshape: input and output non-unit dimensions do not pair up")
    return shape
