"""A slow, obviously-correct interpreter for RustConv blobs, built on torch.

It executes a blob exactly as the schema describes it (values by index,
nodes in order, explicit left/right padding, constants read from the
segment), so tests can check that ``preprocess`` preserved the meaning of
the subgraph, and the runtime can be compared against it when debugging.
It is not used on any export or inference path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rustconv.blob import read_blob
from rustconv.fb.DType import DType
from rustconv.fb.Graph import GraphT
from rustconv.fb.Op import Op
from rustconv.fb.ValueKind import ValueKind
from rustconv.ops import linear_scan

__all__ = ["run_blob"]

_TORCH_DTYPES = {DType.Float32: torch.float32, DType.Float16: torch.float16}
_NUMPY_DTYPES = {DType.Float32: "<f4", DType.Float16: "<f2"}


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
        if value.kind == ValueKind.Constant:
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
        if node.opType == Op.Conv1d:
            x = F.pad(env[op.input], (op.padLeft, op.padRight))
            bias = None if op.bias < 0 else env[op.bias]
            env[op.output] = F.conv1d(x, env[op.weight], bias, op.stride, 0, op.dilation, op.groups)
        elif node.opType == Op.LinearScan:
            env[op.output] = linear_scan(env[op.x0], env[op.a], env[op.u])
        else:
            raise ValueError(f"unknown op type {node.opType} in node {node.name!r}")
    return [env[i] for i in outputs_list]
