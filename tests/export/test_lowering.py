"""End-to-end lowering: both flows, the blob contents, dynamic shapes, errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import rustconv
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner,
)
from rustconv import DynamicShapeError, RustConvBackend, UnsupportedGraphError
from rustconv.compile_specs import num_threads
from rustconv.export.blob import HEADER_SIZE, read_blob
from rustconv.fb.DType import DType
from rustconv.fb.Graph import Graph, GraphT
from rustconv.fb.Op import Op
from rustconv.fb.ValueKind import ValueKind
from rustconv_test_helpers import (
    BACKEND_ID,
    assert_blob_matches_subgraph,
    export,
    lower,
    lowered_modules,
    ops_named,
    top_level_targets,
)
from torch import nn
from torch.export import Dim


class SSMBlock(nn.Module):
    """Causal depthwise conv -> gated linear scan -> pooled Linear head."""

    def __init__(self, channels=8):
        super().__init__()
        self.proj = nn.Conv1d(4, channels, 1)
        self.mix = nn.Conv1d(channels, channels, 4, groups=channels, padding=3)
        self.head = nn.Linear(channels, 3)

    def forward(self, x, decay, x0):
        h = self.proj(x)
        h = self.mix(h)[:, :, : x.shape[2]]  # causal: drop the right overhang
        y = torch.ops.rustconv.linear_scan(x0, decay, h)
        return self.head(y.mean(dim=-1)), y


def ssm_inputs(seq=24):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 4, seq, generator=g),
        torch.rand(2, 8, seq, generator=g),
        torch.randn(2, 8, generator=g),
    )


SEQ = Dim("seq", max=256)
SSM_DYNAMIC = ({2: SEQ}, {2: SEQ}, None)


@pytest.fixture(scope="module")
def mixed():
    torch.manual_seed(0)
    return lower(
        SSMBlock(),
        ssm_inputs(),
        "transform",
        dynamic_shapes=SSM_DYNAMIC,
        partitioners=[
            rustconv.RustConvPartitioner(compile_specs=[num_threads(2)]),
            XnnpackPartitioner(),
        ],
    )


def test_mixed_flow_splits_work_between_backends(mixed):
    ours = lowered_modules(mixed)
    xnnpack = lowered_modules(mixed, "XnnpackBackend")
    assert ours and xnnpack
    left = top_level_targets(mixed)
    assert ops_named(left, "aten.conv") == 0 and ops_named(left, "linear_scan") == 0

    def targets(lm):
        return [
            n.target.__name__ for n in lm.original_module.graph.nodes if n.op == "call_function"
        ]

    ours_ops = [t for lm in ours for t in targets(lm)]
    assert ops_named(ours_ops, "aten.conv") == 2  # convolution or conv1d
    assert ops_named(ours_ops, "rustconv.linear_scan") == 1
    xnn_ops = [t for lm in xnnpack for t in targets(lm)]
    assert ops_named(xnn_ops, "aten.conv") == 0
    # XNNPACK took the Linear head (decomposed to addmm by the time it partitions).
    assert any("addmm" in t or "linear" in t for t in xnn_ops)
    for lm in ours:
        assert lm.compile_specs == [num_threads(2)]
        assert_blob_matches_subgraph(lm)


def test_executorch_program_records_backend_and_specs(mixed):
    program = mixed.to_executorch().executorch_program
    delegates = program.execution_plan[0].delegates
    ids = [d.id for d in delegates]
    assert BACKEND_ID in ids and "XnnpackBackend" in ids
    ours = [d for d in delegates if d.id == BACKEND_ID]
    for delegate in ours:
        specs = {s.key: bytes(s.value) for s in delegate.compile_specs}
        assert specs == {"num_threads": struct.pack("<I", 2)}


@pytest.mark.parametrize("flow", ["to_edge", "transform"])
def test_ssm_block_lowers_in_both_flows(flow):
    torch.manual_seed(0)
    edge = lower(SSMBlock(), ssm_inputs(), flow, dynamic_shapes=SSM_DYNAMIC)
    ours = lowered_modules(edge)
    assert ours
    nodes = [
        n for lm in ours for n in GraphT.InitFromObj(read_blob(lm.processed_bytes).graph).nodes
    ]
    # The head's pooling (mean over time, then a squeeze) is a reduction
    # RustConv runs too; the Linear is left to the next backend.
    assert sorted(n.opType for n in nodes) == sorted(
        [Op.Conv1d, Op.Conv1d, Op.LinearScan, Op.Reduce, Op.Reshape]
    )
    for lm in ours:
        assert_blob_matches_subgraph(lm)


class TwoConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(3, 5, 3, padding=1)
        self.b = nn.Conv1d(5, 7, 2, bias=False)

    def forward(self, x):
        h = self.a(x)
        return self.b(h), h


def test_blob_contents():
    torch.manual_seed(0)
    model = TwoConvs()
    (lm,) = lowered_modules(lower(model, (torch.randn(1, 3, 10),), "to_edge"))
    data = lm.processed_bytes
    parsed = read_blob(data)
    assert data[:4] == b"RCNV"
    assert parsed.header.flatbuffer_offset == HEADER_SIZE
    assert parsed.header.segment_offset % 64 == 0
    assert Graph.GraphBufferHasIdentifier(parsed.flatbuffer, 0)
    root = Graph.GetRootAs(parsed.flatbuffer, 0)
    assert root.NodesLength() == 2

    graph = GraphT.InitFromObj(root)
    by_name = {v.name.decode(): v for v in graph.values}
    # Constants: exact bytes of the weights, each 64-byte aligned.
    weights = {
        "p_a_weight": model.a.weight,
        "p_a_bias": model.a.bias,
        "p_b_weight": model.b.weight,
    }
    for name, tensor in weights.items():
        value = by_name[name]
        assert value.kind == ValueKind.Constant and value.dtype == DType.Float32
        assert value.constantOffset % 64 == 0
        raw = parsed.segment[value.constantOffset : value.constantOffset + value.constantSize]
        assert raw == tensor.detach().numpy().astype("<f4").tobytes()
        assert [d.size for d in value.dims] == list(tensor.shape)
    assert parsed.header.segment_size == max(
        v.constantOffset + v.constantSize for v in graph.values if v.kind == ValueKind.Constant
    )

    # IO: one input; the intermediate h is also returned, so it is an Output.
    (inp,) = [v for v in graph.values if v.kind == ValueKind.Input]
    assert inp.name == b"x" and inp.ioIndex == 0
    outputs = [graph.values[i] for i in graph.outputs]
    assert [v.kind for v in outputs] == [ValueKind.Output] * 2
    assert [v.ioIndex for v in outputs] == [0, 1]
    out_node = lm.original_module.graph.output_node()
    assert [v.name.decode() for v in outputs] == [n.name for n in out_node.args[0]]

    # Nodes: ids are positions; the second conv reads the first one's output.
    first, second = graph.nodes
    assert (first.id, second.id) == (0, 1)
    assert second.op.input == first.op.output
    assert graph.values[first.op.output].kind == ValueKind.Output
    assert second.op.bias == -1
    assert first.name.decode().startswith("aten_convolution")


def test_debug_handles_map_back_to_the_edge_program():
    (lm,) = lowered_modules(lower(TwoConvs(), (torch.randn(1, 3, 10),), "to_edge"))
    graph = GraphT.InitFromObj(read_blob(lm.processed_bytes).graph)
    original = {
        n.name: n.meta["debug_handle"]
        for n in lm.original_module.graph.nodes
        if n.op == "call_function"
    }
    handle_map = lm.meta["debug_handle_map"]
    for node in graph.nodes:
        handles = [int(h) for h in node.debugHandles]
        assert handles == [original[node.name.decode()]]
        assert handle_map[node.id] == tuple(handles)


def test_fused_pad_contributes_its_debug_handle():
    model = nn.Sequential(nn.Conv1d(4, 4, 2, padding="same"))  # pad + conv in to_edge
    (lm,) = lowered_modules(lower(model, (torch.randn(1, 4, 8),), "to_edge"))
    (node,) = GraphT.InitFromObj(read_blob(lm.processed_bytes).graph).nodes
    expected = sorted(
        {n.meta["debug_handle"] for n in lm.original_module.graph.nodes if n.op == "call_function"}
    )
    assert sorted(int(h) for h in node.debugHandles) == expected


class Strided(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 5, stride=3, padding=2, dilation=2)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("flow", ["to_edge", "transform"])
def test_dynamic_dims_record_upper_bounds(flow):
    edge = lower(
        Strided(),
        (torch.randn(1, 4, 64),),
        flow,
        dynamic_shapes=({2: Dim("seq", min=16, max=1000)},),
    )
    (lm,) = lowered_modules(edge)
    graph = GraphT.InitFromObj(read_blob(lm.processed_bytes).graph)
    x = graph.values[graph.inputs[0]]
    y = graph.values[graph.outputs[0]]
    assert [(d.size, d.dynamic) for d in x.dims] == [(1, False), (4, False), (1000, True)]
    # (1000 + 2*2 - 2*(5-1) - 1) // 3 + 1 = 332
    assert [(d.size, d.dynamic) for d in y.dims] == [(1, False), (4, False), (332, True)]
    assert_blob_matches_subgraph(lm)


def test_unbounded_dynamic_dim_is_refused():
    with pytest.raises(DynamicShapeError, match=r"no finite upper bound.*max="):
        lower(
            Strided(),
            (torch.randn(1, 4, 64),),
            "to_edge",
            dynamic_shapes=({2: Dim("seq", min=16)},),
        )


def test_linear_scan_value_dims_and_dtype():
    class Scan(nn.Module):
        def forward(self, x0, a, u):
            return torch.ops.rustconv.linear_scan(x0, a, u)

    x0, a, u = torch.randn(2, 3), torch.rand(2, 3, 9), torch.randn(2, 3, 9)
    seq = Dim("seq", max=64)
    edge = lower(Scan(), (x0, a, u), "transform", dynamic_shapes=(None, {2: seq}, {2: seq}))
    (lm,) = lowered_modules(edge)
    graph = GraphT.InitFromObj(read_blob(lm.processed_bytes).graph)
    (node,) = graph.nodes
    assert node.opType == Op.LinearScan
    assert [graph.values[i].name.decode() for i in graph.inputs] == ["x0", "a", "u"]
    assert (node.op.x0, node.op.a, node.op.u) == tuple(graph.inputs)
    out = graph.values[node.op.output]
    assert out.kind == ValueKind.Output
    assert [(d.size, d.dynamic) for d in out.dims] == [(2, False), (3, False), (64, True)]
    assert_blob_matches_subgraph(lm)


# -- preprocess on hand-made subgraphs (shapes the partitioner never produces) --


def test_preprocess_refuses_pass_through_outputs():
    class PassThrough(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 2, 1)

        def forward(self, x):
            return self.conv(x), x

    ep = export(PassThrough(), (torch.randn(1, 2, 4),))
    with pytest.raises(UnsupportedGraphError, match="pass-through"):
        RustConvBackend.preprocess(ep, [])


def test_preprocess_refuses_duplicate_outputs():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 2, 1)

        def forward(self, x):
            y = self.conv(x)
            return y, y

    ep = export(Twice(), (torch.randn(1, 2, 4),))
    with pytest.raises(UnsupportedGraphError, match="more than once"):
        RustConvBackend.preprocess(ep, [])


def test_preprocess_refuses_foreign_ops():
    class Cumsum(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 2, 1)

        def forward(self, x):
            return torch.cumsum(self.conv(x), -1)

    ep = export(Cumsum(), (torch.randn(1, 2, 4),))
    with pytest.raises(UnsupportedGraphError, match="cannot lower.*cumsum"):
        RustConvBackend.preprocess(ep, [])


def test_preprocess_accepts_an_aten_program_directly():
    ep = export(TwoConvs(), (torch.randn(1, 3, 10),))
    result = RustConvBackend.preprocess(ep, [num_threads(1)])
    graph = GraphT.InitFromObj(read_blob(result.processed_bytes).graph)
    assert [n.opType for n in graph.nodes] == [Op.Conv1d, Op.Conv1d]
    assert set(result.debug_handle_map) <= {0, 1}


def test_lifted_and_buffer_constants_are_embedded():
    class Buffers(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.randn(4, 4, 1))
            self.register_buffer("b", torch.randn(4), persistent=False)

        def forward(self, x):
            return F.conv1d(x, self.w, self.b)

    model = Buffers()
    (lm,) = lowered_modules(lower(model, (torch.randn(1, 4, 5),), "transform"))
    parsed = read_blob(lm.processed_bytes)
    graph = GraphT.InitFromObj(parsed.graph)
    constants = {v.name.decode(): v for v in graph.values if v.kind == ValueKind.Constant}
    assert set(constants) == {"b_w", "b_b"}
    for name, tensor in (("b_w", model.w), ("b_b", model.b)):
        v = constants[name]
        got = np.frombuffer(
            parsed.segment[v.constantOffset : v.constantOffset + v.constantSize], "<f4"
        )
        np.testing.assert_array_equal(got, tensor.numpy().ravel())


def test_lowering_builder_satisfies_the_protocol_the_lowerings_use():
    """The op lowerings are written against ``ops_lowering.builder.Builder``;
    the real builder has every member of it, and the lowerings use no member
    of the builder the protocol leaves out (no type checker runs in CI)."""
    import re
    from pathlib import Path

    from rustconv.export.lowering import LoweringBuilder
    from rustconv.export.ops_lowering.builder import Builder

    ep = torch.export.export(nn.Conv1d(2, 2, 3), (torch.randn(1, 2, 8),))
    assert isinstance(LoweringBuilder(ep), Builder)
    members = {n for n in dir(Builder) if not n.startswith("_")} | set(Builder.__annotations__)
    used = set()
    for path in Path(rustconv.__file__).parent.glob("export/ops_lowering/*.py"):
        used |= set(re.findall(r"\bbuilder\.([a-z_]+)", path.read_text()))
    assert used and used <= members, sorted(used - members)


def test_a_new_intermediate_takes_a_computed_shape_with_its_upper_bound():
    """``Builder.new_intermediate``: a helper value whose shape no node has (a
    transposed conv's phases ``[B, Co*s, T + c]``), its dynamic size an
    expression of the length with the bound the length's range gives it."""
    from rustconv.export.lowering import LoweringBuilder

    ep = torch.export.export(
        nn.ReLU(), (torch.randn(1, 2, 8),), dynamic_shapes=({2: Dim("t", max=50)},)
    )
    x = next(n for n in ep.graph.nodes if n.op == "placeholder")
    length = x.meta["val"].shape[2]
    builder = LoweringBuilder(ep)
    index = builder.new_intermediate("phases", torch.float32, [1, 6, (length + 2) * 3])
    value = builder.graph.values[index]
    assert value.kind == ValueKind.Intermediate and value.dtype == torch.float32
    assert [(d.size, d.dynamic) for d in value.dims] == [(1, False), (6, False), (156, True)]
    assert str(value.shape[2]) == str(3 * length.node.expr + 6)
    with pytest.raises(UnsupportedGraphError, match="dtype"):
        builder.new_intermediate("ints", torch.int32, [4])
