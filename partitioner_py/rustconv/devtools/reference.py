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


def run_blob(blob: bytes, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Runs ``blob`` on ``inputs`` (in delegate-input order); returns its outputs."""
    parsed = read_blob(blob)
    graph = GraphT.InitFromObj(parsed.graph)
    values = graph.values or []
    inputs_list = [int(i) for i in (graph.inputs if graph.inputs is not None else [])]
    outputs_list = [int(i) for i in (graph.outputs if graph.outputs is not None else [])]
    if len(inputs) != len(inputs_list):
        raise ValueError(f"blob takes {len(inputs_list)} inputs, got {len(inputs)}")

    env: dict[int, torch.Tensor] = {}
    for index, value in enumerate(values):
        if value.kind in (ValueKind.Constant, ValueKind.State):  # a state: its initial value
            raw = parsed.segment[value.constantOffset : value.constantOffset + value.constantSize]
            shape = [d.size for d in value.dims]
            array = np.frombuffer(raw, dtype=_NUMPY_DTYPES[value.dtype]).reshape(shape)
            env[index] = torch.from_numpy(array.copy())
    for position, index in enumerate(inputs_list):
        value = values[index]
        tensor = inputs[position]
        if tensor.dim() != len(value.dims):
            raise ValueError(f"input {position} is {tensor.dim()}-D, expected {len(value.dims)}-D")
        for dim, size in zip(value.dims, tensor.shape, strict=True):
            ok = size <= dim.size if dim.dynamic else size == dim.size
            if not ok:
                raise ValueError(f"input {position} has shape {tuple(tensor.shape)}")
        env[index] = tensor.to(_TORCH_DTYPES[value.dtype]).contiguous()

    for node in graph.nodes or []:
        op = node.op
        result = _run_node(node.opType, op, env, values, node.name)
        env[op.output] = result.to(_TORCH_DTYPES[values[op.output].dtype]).contiguous()
    return [env[i] for i in outputs_list]


def _run_node(op_type: int, op, env: dict[int, torch.Tensor], values, name) -> torch.Tensor:
    def read(index: int) -> torch.Tensor:
        return env[index].float()

    def operand(index: int, scalar: float) -> torch.Tensor:
        return read(index) if index >= 0 else torch.tensor(scalar, dtype=torch.float32)

    if op_type == Op.Conv1d:
        x = F.pad(read(op.input), (op.padLeft, op.padRight))
        bias = None if op.bias < 0 else read(op.bias)
        return F.conv1d(x, read(op.weight), bias, op.stride, 0, op.dilation, op.groups)
    if op_type == Op.LinearScan:
        return linear_scan(read(op.x0), read(op.a), read(op.u))
    if op_type == Op.Unary:
        return _UNARY[op.op](read(op.input))
    if op_type == Op.Binary:
        result = _BINARY[op.op](operand(op.a, op.aScalar), operand(op.b, op.bScalar))
        return result.float()  # comparisons: 1.0 / 0.0
    if op_type == Op.Where:
        cond = read(op.cond) != 0
        return torch.where(cond, operand(op.a, op.aScalar), operand(op.b, op.bScalar))
    if op_type == Op.Clamp:
        low = op.min if op.hasMin else None
        high = op.max if op.hasMax else None
        x = read(op.input)
        return x.clone() if low is None and high is None else torch.clamp(x, low, high)
    if op_type == Op.Full:
        return torch.full(env[op.like].shape, op.value, dtype=torch.float32)
    if op_type == Op.Permute:
        return read(op.input).permute([int(p) for p in op.perm])
    if op_type == Op.Slice:
        x = read(op.input)
        index = (slice(None),) * op.dim + (slice(op.start, op.end, op.step),)
        return x[index]
    if op_type == Op.Reshape:
        return read(op.input).reshape(
            _reshaped(env[op.input].shape, values[op.input], values[op.output])
        )
    if op_type == Op.Cat:
        return torch.cat([read(i) for i in op.inputs], dim=op.dim)
    if op_type == Op.Reduce:
        x, dims = read(op.input), [int(d) for d in op.dims]
        if op.op == ReduceOp.Sum:
            return x.sum(dims, keepdim=True)
        if op.op == ReduceOp.Mean:
            return x.mean(dims, keepdim=True)
        return x.var(dims, correction=0, keepdim=True)
    raise ValueError(f"unknown op type {op_type} in node {name!r}")


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
