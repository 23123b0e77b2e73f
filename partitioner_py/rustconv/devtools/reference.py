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

What each op kind computes is stated beside its lowering, in its module of
:mod:`rustconv.export.ops_lowering` (``@evaluates``, one evaluator per schema
table; the unary, binary and reduction tables give each code's meaning in the
row that lowers to it); this module walks the blob and implements the
:class:`~rustconv.export.ops_lowering.evaluators.BlobEnv` they read. A new op
kind therefore needs no edit here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

import rustconv.export.ops_lowering  # noqa: F401  (its modules register the evaluators)
from rustconv.export.blob import read_blob
from rustconv.export.ops_lowering.evaluators import evaluator_for
from rustconv.fb.DType import DType
from rustconv.fb.Graph import GraphT
from rustconv.fb.ValueKind import ValueKind

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
    """The tensors computed so far, by value index, and the blob's values
    (the evaluators' :class:`~rustconv.export.ops_lowering.evaluators.BlobEnv`)."""

    def __init__(self, tensors: dict[int, torch.Tensor], values) -> None:
        self.tensors = tensors
        self.values = values

    def read(self, index: int) -> torch.Tensor:
        return self.tensors[index].float()

    def operand(self, index: int, scalar: float) -> torch.Tensor:
        """A value, or the scalar beside it where the index is -1."""
        return self.read(index) if index >= 0 else torch.tensor(scalar, dtype=torch.float32)

    def shape(self, index: int) -> torch.Size:
        return self.tensors[index].shape

    def dims(self, index: int) -> list:
        return list(self.values[index].dims)


def _run_node(op_type: int, op, env: _Env, name) -> torch.Tensor:
    run = evaluator_for(op_type)
    if run is None:
        raise ValueError(f"unknown op type {op_type} in node {name!r}")
    return run(op, env)
