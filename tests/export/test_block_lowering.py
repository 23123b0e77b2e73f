"""The reference blocks (rustconv.examples.blocks) through both lowering flows.

Per block and flow: exactly one RustConvBackend call, what stays outside it,
how many blob nodes and fused kernels it has, and the whole lowered program
(RustConv delegates run by rustconv.devtools.reference, XNNPACK delegates by their
subgraphs) against eager on random, all-ones and ramp inputs, at several
sequence lengths where the block is dynamic, in float32 and float16.

Expected groupings (dim 8, k 3 for the LFM2 blocks):

* ``Lfm2ShortConvExampleCore``: 11 ops -> 13 nodes in 2 kernels. Kernel 0 is a
  pass kernel computing the new conv state (``slice(cat(state, B^T * x^T))``);
  kernel 1 is the convolution with ``cat(state, B^T * x^T)`` as its prologue
  (the transposes, the product and the cat duplicated there rather than
  materialised) and ``(C^T * conv)^T`` as its epilogue. ``[..., :seqlen]``
  folds into the conv.
* ``Lfm2ShortConvExample``: the same 13 nodes in 2 kernels; the linears (mm)
  and the reshapes ``to_edge`` wraps around them stay outside.
* ``Lfm2ShortConvHFCore``: 11 ops -> 8 nodes, 1 kernel (the causal slice folds
  into the conv's padding, the chunk becomes three slices).
* ``Lfm2ShortConvHF``: 8 nodes, 1 kernel; the linears stay outside.
* ``HyenaLongConv``: 7 ops (the causal pad folds) -> 6 nodes, 1 kernel.
* ``DiagonalSSM``: 12 ops -> 12 nodes (softplus decomposed), 1 kernel.
* ``ConvStack``: 24 ops -> 24 nodes, 12 kernels (conv + ReLU each).

The blocks are lowered with ``stateful=False``: the LFM2 example's conv state
stays a delegate input and its new value a delegate output, which is what
lets these tests set the state and read its update. The delegate-owned form
(the default) is tested on the streaming blocks in ``tests/test_streaming.py``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from rustconv import RustConvPartitioner, blocks
from rustconv.fb.Op import Op
from rustconv_test_helpers import (
    blob_graph,
    kernel_count,
    lowered_modules,
    run_lowered,
    structured_inputs,
    top_level_targets,
)

FLOWS = ["to_edge", "transform"]
LINEAR_LEFTOVERS = {"aten.mm.default", "aten.permute_copy.default", "aten.view_copy.default"}


@dataclass(frozen=True)
class Block:
    factory: object
    dynamic: bool  # exported with a dynamic sequence length
    nodes: int
    kernels: int
    ops: int  # ATen ops the delegate absorbs (to_edge flow)
    anchors: tuple[int, ...]  # Conv1d / LinearScan count in the blob
    linears: int = 0  # mm left outside in the to_edge flow


BLOCKS = {
    "lfm2_example_core": Block(lambda: blocks.Lfm2ShortConvExampleCore(8), True, 13, 2, 11, (1, 0)),
    "lfm2_example": Block(lambda: blocks.Lfm2ShortConvExample(8), False, 13, 2, 10, (1, 0), 4),
    "lfm2_hf_core": Block(lambda: blocks.Lfm2ShortConvHFCore(8), True, 8, 1, 11, (1, 0)),
    "lfm2_hf": Block(lambda: blocks.Lfm2ShortConvHF(8), False, 8, 1, 10, (1, 0), 2),
    "hyena": Block(lambda: blocks.HyenaLongConv(4, 16), False, 6, 1, 7, (1, 0)),
    "diagonal_ssm": Block(lambda: blocks.DiagonalSSM(4), True, 12, 1, 12, (0, 1)),
    "conv_stack": Block(lambda: blocks.ConvStack(4, 3), True, 24, 12, 24, (12, 0)),
}


def _model(name: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = BLOCKS[name].factory().eval()
    if isinstance(model, blocks.Lfm2ShortConvExampleCore):
        # A state that is not zero, so using it (or not) shows.
        model.conv_state.copy_(torch.randn(model.conv_state.shape))
    return model.to(dtype)


def _lower(model: torch.nn.Module, inputs, flow: str, dynamic: bool):
    ep = torch.export.export(
        model, tuple(inputs), dynamic_shapes=model.dynamic_shapes() if dynamic else None
    )
    if flow == "to_edge":
        return to_edge(ep).to_backend(RustConvPartitioner(stateful=False))
    return to_edge_transform_and_lower(
        ep, partitioner=[RustConvPartitioner(stateful=False), XnnpackPartitioner()]
    )


_CACHE: dict = {}


def lowered(name: str, flow: str, dtype: torch.dtype = torch.float32):
    key = (name, flow, dtype)
    if key not in _CACHE:
        model = _model(name, dtype)
        _CACHE[key] = _lower(model, model.make_inputs(dtype=dtype), flow, BLOCKS[name].dynamic)
    return _CACHE[key]


def _input_shapes(model, seq: int | None) -> list[tuple[int, ...]]:
    example = model.make_inputs() if seq is None else model.make_inputs(seq=seq)
    return [tuple(t.shape) for t in example]


def _eager(model: torch.nn.Module, inputs):
    """Outputs and (for the LFM2 example) the updated state, on a copy."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        out = model(*inputs)
    state = getattr(model, "conv_state", None)
    return out, state


def _check_against_eager(name, flow, inputs, dtype, atol):
    edge = lowered(name, flow, dtype)
    model = _model(name, dtype)
    reference_model = _model(name).float()
    if dtype != torch.float32:
        # Eager in float32 on the float16-rounded weights and inputs; the
        # reference rounds to float16 after every node.
        reference_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    want, want_state = _eager(reference_model, [t.float() for t in inputs])
    buffers = {"conv_state": model.conv_state} if want_state is not None else None
    (got,), mutated = run_lowered(edge, inputs, buffers)
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got.float(), want, atol=atol * scale, rtol=0)
    if want_state is not None:
        torch.testing.assert_close(mutated["conv_state"].float(), want_state, atol=atol, rtol=0)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_is_one_delegate_call_with_expected_kernels(name, flow):
    block = BLOCKS[name]
    edge = lowered(name, flow)
    (lm,) = lowered_modules(edge)
    graph = blob_graph(lm)
    assert (len(graph.nodes), kernel_count(lm)) == (block.nodes, block.kernels)
    assert kernel_count(lm) < len(graph.nodes) or block.kernels == block.nodes
    ops = [n for n in lm.original_module.graph.nodes if n.op == "call_function"]
    if flow == "to_edge":
        assert len(ops) == block.ops
    anchors = (
        sum(n.opType == Op.Conv1d for n in graph.nodes),
        sum(n.opType == Op.LinearScan for n in graph.nodes),
    )
    assert anchors == block.anchors
    # Kernels are consecutive and numbered 0, 1, ... in node order.
    kernels = [n.kernel for n in graph.nodes]
    assert kernels == sorted(kernels) and set(kernels) == set(range(block.kernels))

    outside = [
        t for t in top_level_targets(edge) if t not in ("executorch_call_delegate", "getitem")
    ]
    if flow == "transform" or not block.linears:
        assert outside == []
    else:
        assert set(outside) <= LINEAR_LEFTOVERS
        assert outside.count("aten.mm.default") == block.linears
    if flow == "transform" and block.linears:
        assert lowered_modules(edge, "XnnpackBackend")  # the linears went to XNNPACK


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_matches_eager(name, flow):
    model = _model(name)
    lengths = [None, 5, 23] if BLOCKS[name].dynamic else [None]
    for seq in lengths:
        for kind, inputs in structured_inputs(_input_shapes(model, seq)).items():
            try:
                _check_against_eager(name, flow, inputs, torch.float32, 1e-4)
            except AssertionError as e:
                raise AssertionError(f"{kind} inputs, seq {seq}: {e}") from None


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_matches_eager_in_float16(name, flow):
    model = _model(name)
    edge = lowered(name, flow, torch.float16)
    (lm,) = lowered_modules(edge)
    assert all(v.dtype == 1 for v in blob_graph(lm).values)  # DType.Float16
    inputs = structured_inputs(_input_shapes(model, None), dtype=torch.float16)["random"]
    # float16 rounds every node's result: ~1e-3 relative per node.
    _check_against_eager(name, flow, inputs, torch.float16, 2e-2)


def test_example_state_is_a_delegate_input_and_its_update_an_output():
    edge = lowered("lfm2_example_core", "to_edge")
    (lm,) = lowered_modules(edge)
    graph = blob_graph(lm)
    names = [graph.values[i].name.decode() for i in graph.inputs]
    assert "b_conv_state" in names  # not a constant baked into the blob
    assert all(v.name.decode() != "b_conv_state" or v.kind == 0 for v in graph.values)
    sig = edge.exported_program().graph_signature
    assert list(sig.buffers_to_mutate.values()) == ["conv_state"]
    # ExecuTorch's copy back stays outside; the delegate returns the new state.
    call = next(
        n
        for n in edge.exported_program().graph.nodes
        if n.op == "call_function" and "executorch_call_delegate" in str(n.target)
    )
    assert "b_conv_state" in [a.name for a in call.args[1:]]
    assert len(graph.outputs) == 2


def test_softplus_is_kept_whole_with_rustconv_alone():
    """With RustConv as the only partitioner, ops_to_not_decompose keeps softplus:
    one Unary Softplus instead of exp, log1p, gt and where."""
    model = _model("diagonal_ssm")
    ep = torch.export.export(model, model.make_inputs())
    edge = to_edge_transform_and_lower(ep, partitioner=[RustConvPartitioner()])
    (lm,) = lowered_modules(edge)
    targets = [n.target.__name__ for n in lm.original_module.graph.nodes if n.op == "call_function"]
    assert "aten.softplus.default" in targets
    assert len(blob_graph(lm).nodes) == 9 and kernel_count(lm) == 1
    inputs = model.make_inputs(seed=3)
    (got,), _ = run_lowered(edge, inputs)
    torch.testing.assert_close(got, model(*inputs), atol=1e-4, rtol=0)


def test_full_block_with_dynamic_length_in_to_edge_keeps_shared_sizes_outside():
    """to_edge decomposes the linears into views that read the sequence length
    through the same sym_size node as the conv's [..., :seqlen]; a SymInt cannot
    cross the delegate boundary, so that slice and what follows it stay outside,
    and explain() says why. (Between the projections, the whole block is taken.)"""
    model = _model("lfm2_hf")
    ep = torch.export.export(model, model.make_inputs(), dynamic_shapes=model.dynamic_shapes())
    edge = to_edge(ep)
    reasons = RustConvPartitioner().explain(edge.exported_program())
    assert any("SymInt" in r or "symint" in r for r in reasons.values()), reasons
    lowered_edge = edge.to_backend(RustConvPartitioner())
    assert len(lowered_modules(lowered_edge)) == 1
    inputs = model.make_inputs(seq=11)
    (got,), _ = run_lowered(lowered_edge, inputs)
    torch.testing.assert_close(got, model(*inputs), atol=1e-4, rtol=0)
