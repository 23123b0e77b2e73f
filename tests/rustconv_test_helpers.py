"""Shared helpers for the rustconv export-side tests.

Beside ``conftest.py`` (the end-to-end tests' helpers) in the one test root,
importable from every directory under it (pytest puts ``tests/`` on
``sys.path`` for its ``conftest.py``); a module of its own rather than more
of ``conftest`` because the export tests (``tests/export``) need little of
what that one sets up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import rustconv
import torch
from executorch.exir import (
    EdgeProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)
from executorch.exir.lowered_backend_module import (
    LoweredBackendModule,
    get_lowered_submodules,
)
from rustconv.devtools.reference import run_blob
from rustconv.export.backend import RustConvBackend

BACKEND_ID = RustConvBackend.__name__


def export(model: torch.nn.Module, inputs: tuple, dynamic_shapes=None):
    return torch.export.export(model.eval(), inputs, dynamic_shapes=dynamic_shapes)


def lower(
    model: torch.nn.Module,
    inputs: tuple,
    flow: str,
    dynamic_shapes=None,
    partitioners: list | None = None,
) -> EdgeProgramManager:
    """Exports and lowers with RustConv through ``flow`` ("to_edge" or "transform")."""
    ep = export(model, inputs, dynamic_shapes)
    partitioners = partitioners or [rustconv.RustConvPartitioner()]
    if flow == "to_edge":
        edge = to_edge(ep)
        for partitioner in partitioners:
            edge = edge.to_backend(partitioner)
        return edge
    if flow == "transform":
        return to_edge_transform_and_lower(ep, partitioner=partitioners)
    raise ValueError(flow)


def lowered_modules(
    edge: EdgeProgramManager, backend_id: str | None = BACKEND_ID
) -> list[LoweredBackendModule]:
    gm = edge.exported_program().graph_module
    return [
        lm
        for _, lm, _ in get_lowered_submodules(gm)
        if backend_id is None or lm.backend_id == backend_id
    ]


def top_level_targets(edge: EdgeProgramManager) -> list[str]:
    """Names of the ops left outside any delegate."""
    return [
        str(getattr(n.target, "__name__", n.target))
        for n in edge.exported_program().graph.nodes
        if n.op == "call_function"
    ]


def _concrete(size) -> int:
    if isinstance(size, int):
        return size
    hint = size.node.hint
    if hint is None:
        env = size.node.shape_env.var_to_val
        hint = size.node.expr.xreplace(env)
    return int(hint)


def delegate_example_inputs(lm: LoweredBackendModule) -> list[torch.Tensor]:
    """Random inputs for a delegate, in delegate-input order, at the example sizes."""
    ep = lm.original_module
    sig = ep.graph_signature
    constants = (
        set(sig.inputs_to_parameters)
        | set(sig.inputs_to_buffers)
        | set(sig.inputs_to_lifted_tensor_constants)
    )
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name not in constants:
            val = node.meta["val"]
            shape = [_concrete(s) for s in val.shape]
            # Values in (0.5, 1) keep linear scans bounded.
            inputs.append(0.5 + 0.5 * torch.rand(shape, generator=gen, dtype=val.dtype))
    return inputs


def assert_blob_matches_subgraph(lm: LoweredBackendModule, atol: float = 1e-5) -> None:
    """The blob, interpreted, computes what the delegated subgraph computes."""
    inputs = delegate_example_inputs(lm)
    expected = lm.original_module.module()(*inputs)
    if isinstance(expected, torch.Tensor):
        expected = [expected]
    actual = run_blob(lm.processed_bytes, inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e, atol=atol, rtol=1e-5)


def count(items: Iterable, predicate) -> int:
    return sum(1 for item in items if predicate(item))


def ops_named(names: Sequence[str], needle: str) -> int:
    return count(names, lambda n: needle in n)


# -- whole programs, with RustConv delegates run by the reference interpreter --


def blob_graph(lm: LoweredBackendModule):
    from rustconv.export.blob import read_blob
    from rustconv.fb.Graph import GraphT

    return GraphT.InitFromObj(read_blob(lm.processed_bytes).graph)


def kernel_count(lm: LoweredBackendModule) -> int:
    return len({node.kernel for node in blob_graph(lm).nodes})


class _ReferenceInterpreter(torch.fx.Interpreter):
    """Runs a lowered program: RustConv delegates through ``run_blob``, other
    delegates (XNNPACK) through the subgraph they were made from."""

    def call_function(self, target, args, kwargs):
        if target is torch.ops.higher_order.executorch_call_delegate:
            lm, *inputs = args
            if lm.backend_id == BACKEND_ID:
                return tuple(run_blob(lm.processed_bytes, inputs))
            result = lm.original_module.module()(*inputs)
            return tuple(result) if isinstance(result, (list, tuple)) else (result,)
        return super().call_function(target, args, kwargs)


def run_lowered(
    edge: EdgeProgramManager, inputs: Sequence[torch.Tensor], buffers: dict | None = None
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """(user outputs, new values of mutated buffers) of the lowered program.

    ``buffers`` overrides buffer values by name (e.g. a convolution state);
    others come from the program.
    """
    from torch.export.graph_signature import InputKind, OutputKind

    ep = edge.exported_program()
    buffers = buffers or {}
    user = iter(inputs)
    flat = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(user))
        elif spec.kind == InputKind.BUFFER and spec.target in buffers:
            flat.append(buffers[spec.target].clone())
        elif spec.target in ep.state_dict:
            flat.append(ep.state_dict[spec.target])
        else:
            flat.append(ep.constants[spec.target])
    results = _ReferenceInterpreter(ep.graph_module).run(*flat)
    outputs, mutated = [], {}
    for spec, value in zip(ep.graph_signature.output_specs, results, strict=True):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            mutated[spec.target] = value
        else:
            outputs.append(value)
    return outputs, mutated


def structured_inputs(shapes: Sequence[Sequence[int]], dtype=torch.float32, seed: int = 0):
    """Random, all-ones and ramp inputs (ramps span [-1, 1])."""
    gen = torch.Generator().manual_seed(seed)
    sets = {
        "random": [torch.randn(s, generator=gen) for s in shapes],
        "ones": [torch.ones(s) for s in shapes],
        "ramp": [
            torch.linspace(-1, 1, max(1, int(torch.Size(s).numel()))).reshape(s) for s in shapes
        ],
    }
    return {name: [t.to(dtype) for t in ts] for name, ts in sets.items()}
