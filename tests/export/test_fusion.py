"""How preprocess groups blob nodes into fused kernels (rustconv.export.fusion)."""

from __future__ import annotations

import logging

import pytest
import torch
from rustconv import RustConvPartitioner
from rustconv.compile_specs import fusion
from rustconv.export.fusion import assign_kernels, check_kernels
from rustconv.export.ir import OPS, IRGraph
from rustconv.export.lowering import lower_program
from rustconv.fb.Op import Op
from rustconv.fb.ValueKind import ValueKind
from rustconv_test_helpers import (
    blob_graph,
    export,
    lower,
    lowered_modules,
    run_lowered,
)
from torch import nn

OP_NAMES = {v: k for k, v in vars(Op).items() if not k.startswith("_")}


def kernels(lm) -> list[list[str]]:
    """The blob's kernels, each as the op kinds of its nodes in order."""
    result: list[list[str]] = []
    for node in blob_graph(lm).nodes:
        if node.kernel == len(result):
            result.append([])
        result[node.kernel].append(OP_NAMES[node.opType])
    return result


def lowered_one(model, *inputs, partitioner=None):
    edge = lower(
        model.eval(), inputs, "to_edge", partitioners=[partitioner or RustConvPartitioner()]
    )
    (lm,) = lowered_modules(edge)
    for x in (inputs, tuple(torch.randn_like(t) for t in inputs)):
        (got, *_), _ = run_lowered(edge, list(x))
        want = model(*x)
        want = want[0] if isinstance(want, tuple) else want
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    return lm


class ConvThen(nn.Module):
    def __init__(self, fn, c=4):
        super().__init__()
        self.conv = nn.Conv1d(c, c, 3, padding=1)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.conv(x), x)


def test_epilogue_takes_a_diamond_whole():
    # silu decomposes to y * sigmoid(y): y has two readers, joined as one region.
    lm = lowered_one(ConvThen(lambda y, x: torch.nn.functional.silu(y) + x), torch.randn(1, 4, 8))
    assert kernels(lm) == [["Conv1d", "Unary", "Binary", "Binary"]]


def test_epilogue_ends_in_a_permute_chain():
    lm = lowered_one(ConvThen(lambda y, x: torch.relu(y).transpose(1, 2)), torch.randn(1, 4, 8))
    assert kernels(lm) == [["Conv1d", "Unary", "Permute"]]


def test_epilogue_stops_at_a_shape_change():
    # A strided slice is no elementwise op: the conv's result is materialised
    # and the slice runs as the prologue of the pass kernel computing the relu.
    lm = lowered_one(ConvThen(lambda y, x: torch.relu(y[..., ::2])), torch.randn(1, 4, 8))
    assert kernels(lm) == [["Conv1d"], ["Slice", "Unary"]]


def test_epilogue_does_not_take_a_broadcast_to_a_bigger_shape():
    class Wider(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x, z):
            return self.conv(x) + z  # [1, 4, 8] + [2, 4, 8]

    lm = lowered_one(Wider(), torch.randn(1, 4, 8), torch.randn(2, 4, 8))
    assert kernels(lm) == [["Conv1d"], ["Binary"]]


def test_shared_views_are_duplicated_into_each_kernel():
    class TwoConvs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv1d(4, 4, 3, padding=1)
            self.b = nn.Conv1d(4, 4, 5, padding=2)

        def forward(self, x):  # x [1, N, 4]
            h = x.transpose(1, 2) * 2
            return self.a(h) + self.b(h)

    lm = lowered_one(TwoConvs(), torch.randn(1, 8, 4))
    assert kernels(lm) == [
        ["Permute", "Binary", "Conv1d"],
        ["Permute", "Binary", "Conv1d", "Binary"],
    ]
    graph = blob_graph(lm)
    permutes = [n for n in graph.nodes if n.opType == Op.Permute]
    # Same origin (debug handles), private outputs, both virtual.
    assert permutes[0].name == permutes[1].name
    assert list(permutes[0].debugHandles) == list(permutes[1].debugHandles)
    assert permutes[0].op.output != permutes[1].op.output
    # The debug map is per fused kernel: each holds every op it absorbed,
    # the shared permute in both.
    handle_map = lm.meta["debug_handle_map"]
    assert sorted(handle_map) == [0, 1]
    for kernel in (0, 1):
        handles = [int(h) for n in graph.nodes if n.kernel == kernel for h in n.debugHandles]
        assert sorted(handle_map[kernel]) == sorted(set(handles))
        assert set(int(h) for h in permutes[0].debugHandles) <= set(handle_map[kernel])


def test_a_returned_value_is_materialised_once_and_read():
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            h = torch.relu(x)
            return self.conv(h), h

    lm = lowered_one(Both(), torch.randn(1, 4, 8))
    assert kernels(lm) == [["Unary"], ["Conv1d"]]
    graph = blob_graph(lm)
    relu, conv = graph.nodes
    assert conv.op.input == relu.op.output
    assert graph.values[relu.op.output].kind == ValueKind.Output


def test_an_anchor_result_read_by_two_kernels_is_materialised():
    class Fan(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv1d(4, 4, 3, padding=1)
            self.b = nn.Conv1d(4, 4, 1)
            self.c = nn.Conv1d(4, 4, 1)

        def forward(self, x):
            y = torch.relu(self.a(x))
            return self.b(y) * self.c(y)

    lm = lowered_one(Fan(), torch.randn(1, 4, 8))
    assert kernels(lm) == [["Conv1d", "Unary"], ["Conv1d"], ["Conv1d", "Binary"]]


def test_masks_stay_inside_the_kernels_that_read_them():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv1d(4, 4, 3, padding=1)
            self.b = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            m = x > 0
            return self.a(torch.where(m, x, 0.0)) + self.b(torch.where(m, 0.0, x))

    lm = lowered_one(Gate(), torch.randn(1, 4, 8))
    assert kernels(lm) == [["Binary", "Where", "Conv1d"], ["Binary", "Where", "Conv1d", "Binary"]]
    graph = blob_graph(lm)
    masks = [n.op.output for n in graph.nodes if n.opType == Op.Binary and n.op.op == 6]  # Gt
    assert len(set(masks)) == 2
    assert all(graph.values[m].kind == ValueKind.Intermediate for m in masks)


def test_fusion_spec_off_gives_each_node_its_own_kernel():
    model = ConvThen(lambda y, x: torch.sigmoid(y) * x)
    fused = lowered_one(model, torch.randn(1, 4, 8))
    unfused = lowered_one(
        model, torch.randn(1, 4, 8), partitioner=RustConvPartitioner([fusion(False)])
    )
    assert kernels(fused) == [["Conv1d", "Unary", "Binary"]]
    assert kernels(unfused) == [["Conv1d"], ["Unary"], ["Binary"]]
    assert unfused.compile_specs == [fusion(False)]


def _ir(model, *inputs) -> IRGraph:
    return lower_program(export(model.eval(), inputs))


def test_check_kernels_names_the_broken_rule():
    graph = assign_kernels(_ir(ConvThen(lambda y, x: torch.relu(y) * x), torch.randn(1, 4, 8)))
    assert check_kernels(graph) is None
    conv, relu, mul = graph.nodes
    relu.kernel = 2
    assert "consecutive" in check_kernels(graph)
    relu.kernel, mul.kernel = 0, 1
    assert "anchor kernel 0 has 2 materialised results" in check_kernels(
        IRGraph(graph.values, graph.nodes, graph.inputs, graph.outputs + [conv.output])
    )
    graph.nodes[:] = [relu, conv, mul]
    relu.kernel, conv.kernel, mul.kernel = 0, 1, 1
    assert "before it is computed" in check_kernels(graph)


def test_a_reshape_that_splits_or_merges_dimensions_is_a_kernel_of_its_own():
    """A transposed conv's phases, interleaved: each regroup alone in its
    kernel (the runtime copies it), the permute between them a pass, never in
    the conv's epilogue; check_kernels refuses a regroup sharing a kernel."""
    graph = assign_kernels(_ir(nn.ConvTranspose1d(4, 3, 4, 2, padding=1), torch.randn(1, 4, 8)))
    assert [(OP_NAMES[n.op_type], n.kernel) for n in graph.nodes] == [
        ("Conv1d", 0), ("Reshape", 1), ("Permute", 2), ("Reshape", 3), ("Slice", 4),
    ]  # fmt: skip
    assert [n.regroups(graph.values) for n in graph.nodes] == [False, True, False, True, False]
    assert check_kernels(graph) is None
    graph.nodes[2].kernel = 1
    for node in graph.nodes[3:]:
        node.kernel -= 1
    assert "not alone in its kernel" in check_kernels(graph)


def test_a_failed_check_falls_back_to_one_kernel_per_node(monkeypatch, caplog):
    from rustconv.export import fusion as fusion_module

    monkeypatch.setattr(fusion_module, "check_kernels", lambda graph: "injected problem")
    ir = _ir(ConvThen(lambda y, x: torch.relu(y)), torch.randn(1, 4, 8))
    with caplog.at_level(logging.WARNING):
        graph = assign_kernels(ir)
    assert [n.kernel for n in graph.nodes] == [0, 1]
    assert "injected problem" in caplog.text


@pytest.mark.parametrize("enabled", [True, False])
def test_kernel_numbering_is_consecutive(enabled):
    ir = _ir(ConvThen(lambda y, x: torch.relu(y[..., 1:]).transpose(1, 2)), torch.randn(1, 4, 8))
    graph = assign_kernels(ir, enabled=enabled)
    ks = [n.kernel for n in graph.nodes]
    assert ks[0] == 0 and all(b - a in (0, 1) for a, b in zip(ks, ks[1:], strict=False))


def test_the_ir_knows_every_schema_op_once():
    """``ir.OPS`` has an entry for every table of the schema's ``Op`` union,
    with its generated class and value fields that exist on it; a table added
    to the schema without one fails here, not in a lowering."""
    tags = {name: tag for name, tag in vars(Op).items() if not name.startswith("_")}
    del tags["NONE"]
    assert set(OPS) == set(tags.values())
    for name, tag in tags.items():
        spec = OPS[tag]
        assert spec.table.__name__ == f"{name}T"
        table = spec.table()
        assert all(hasattr(table, f) for f in spec.value_fields), name
        assert set(spec.outside_fields) <= set(spec.value_fields), name
    assert {tag for tag, spec in OPS.items() if spec.anchor} == {Op.Conv1d, Op.LinearScan}
