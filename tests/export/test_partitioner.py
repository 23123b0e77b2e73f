"""What RustConvPartitioner tags, in both lowering flows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge
from rustconv import RustConvPartitioner
from rustconv.export.blob import read_blob
from rustconv.export.partitioner import TAG_PREFIX
from rustconv.fb.Graph import GraphT
from rustconv.fb.Op import Op
from rustconv_test_helpers import (
    assert_blob_matches_subgraph,
    export,
    lower,
    lowered_modules,
    ops_named,
    top_level_targets,
)
from torch import nn

FLOWS = ["to_edge", "transform"]


class Wrap(nn.Module):
    def __init__(self, conv: nn.Module, pad=None):
        super().__init__()
        self.conv, self.pad = conv, pad

    def forward(self, x):
        if self.pad is not None:
            x = F.pad(x, self.pad)
        return self.conv(x)


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 2, 3))
        self.b = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.conv1d(x, self.w, self.b, stride=2, padding=1, groups=2)


# name -> (model factory, expected (stride, pad_left, pad_right, dilation, groups, has_bias))
VARIANTS = {
    "basic": (lambda: Wrap(nn.Conv1d(4, 6, 3)), (1, 0, 0, 1, 1, True)),
    "no_bias": (lambda: Wrap(nn.Conv1d(4, 6, 3, bias=False)), (1, 0, 0, 1, 1, False)),
    "depthwise": (
        lambda: Wrap(nn.Conv1d(4, 4, 3, padding=1, groups=4)),
        (1, 1, 1, 1, 4, True),
    ),
    "grouped": (lambda: Wrap(nn.Conv1d(4, 6, 3, groups=2)), (1, 0, 0, 1, 2, True)),
    "stride": (lambda: Wrap(nn.Conv1d(4, 6, 3, stride=2)), (2, 0, 0, 1, 1, True)),
    "dilation_padding": (
        lambda: Wrap(nn.Conv1d(4, 6, 3, dilation=3, padding=2)),
        (1, 2, 2, 3, 1, True),
    ),
    "same_odd": (lambda: Wrap(nn.Conv1d(4, 6, 5, padding="same")), (1, 2, 2, 1, 1, True)),
    # Even total padding: PyTorch puts the extra element on the right.
    "same_even": (lambda: Wrap(nn.Conv1d(4, 6, 4, padding="same")), (1, 1, 2, 1, 1, True)),
    "same_dilated": (
        lambda: Wrap(nn.Conv1d(4, 6, 4, padding="same", dilation=3)),
        (1, 4, 5, 3, 1, True),
    ),
    "valid": (lambda: Wrap(nn.Conv1d(4, 6, 3, padding="valid")), (1, 0, 0, 1, 1, True)),
    "functional": (Functional, (2, 1, 1, 1, 2, True)),
    "causal_pad": (lambda: Wrap(nn.Conv1d(4, 6, 3), pad=(2, 0)), (1, 2, 0, 1, 1, True)),
}


def blob_graph(lm) -> GraphT:
    return GraphT.InitFromObj(read_blob(lm.processed_bytes).graph)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_conv_variants_are_delegated(name, flow):
    factory, (stride, pad_left, pad_right, dilation, groups, has_bias) = VARIANTS[name]
    torch.manual_seed(0)
    edge = lower(factory(), (torch.randn(2, 4, 17),), flow)

    left = top_level_targets(edge)
    assert not any("aten.conv" in t or "pad" in t for t in left), left
    (lm,) = lowered_modules(edge)
    (node,) = blob_graph(lm).nodes
    assert node.opType == Op.Conv1d
    conv = node.op
    assert (conv.stride, conv.padLeft, conv.padRight, conv.dilation, conv.groups) == (
        stride,
        pad_left,
        pad_right,
        dilation,
        groups,
    )
    assert (conv.bias >= 0) == has_bias
    assert_blob_matches_subgraph(lm)


@pytest.mark.parametrize("flow", FLOWS)
def test_conv_form_per_flow(flow):
    """to_edge decomposes conv1d to convolution; transform-and-lower keeps conv1d."""
    model = nn.Sequential(nn.Conv1d(4, 4, 3), nn.Conv1d(4, 4, 4, padding="same"))
    (lm,) = lowered_modules(lower(model, (torch.randn(1, 4, 16),), flow))
    targets = [n.target.__name__ for n in lm.original_module.graph.nodes if n.op == "call_function"]
    if flow == "to_edge":
        assert targets == [
            "aten.convolution.default",
            "aten.constant_pad_nd.default",
            "aten.convolution.default",
        ]
    else:
        assert targets == ["aten.conv1d.default", "aten.conv1d.padding"]


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fp64 = nn.Conv1d(4, 4, 3).double()
        self.conv2d = nn.Conv2d(4, 4, 3)

    def forward(self, x, image):
        return self.fp64(x.double()), self.conv2d(image)


@pytest.mark.parametrize("flow", FLOWS)
def test_fp64_and_2d_convs_are_left_alone(flow):
    """(Transposed 1-D convs are RustConv's: tests/test_conv_transpose.py.)"""
    edge = lower(Unsupported(), (torch.randn(1, 4, 8), torch.randn(1, 4, 6, 6)), flow)
    assert lowered_modules(edge) == []
    assert ops_named(top_level_targets(edge), "convolution") == 2


def test_nonzero_pad_is_not_fused():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3)

        def forward(self, x):
            return self.conv(F.pad(x, (1, 1), value=1.0))

    edge = lower(M(), (torch.randn(1, 4, 8),), "to_edge")
    assert ops_named(top_level_targets(edge), "constant_pad_nd") == 1
    (lm,) = lowered_modules(edge)
    (node,) = blob_graph(lm).nodes
    assert (node.op.padLeft, node.op.padRight) == (0, 0)


class Branchy(nn.Module):
    """conv -> conv (one group), an op RustConv does not run (cumsum) breaks the
    chain (second group)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(4, 4, 3)
        self.b = nn.Conv1d(4, 4, 3)
        self.c = nn.Conv1d(4, 4, 3)

    def forward(self, x):
        return self.c(torch.cumsum(self.b(self.a(x)), -1))


def _tags(edge_program):
    return {
        n.name: n.meta.get("delegation_tag")
        for n in edge_program.graph.nodes
        if n.op in ("call_function", "placeholder")
    }


def test_tags_per_connected_group_and_constants_owned():
    ep = to_edge(export(Branchy(), (torch.randn(1, 4, 16),))).exported_program()
    result = RustConvPartitioner().partition(ep)
    tags = _tags(result.tagged_exported_program)
    convs = [name for name in tags if "convolution" in name]
    assert len(convs) == 3
    first, second, third = (tags[c] for c in convs)
    assert first == second != third
    assert all(t.startswith(TAG_PREFIX) for t in (first, third))
    assert set(result.partition_tags) == {first, third}
    assert tags["aten_cumsum_default"] is None
    # Weights/biases follow their convolution's tag (delegate-owned constants).
    assert tags["p_a_weight"] == tags["p_a_bias"] == first
    assert tags["p_c_weight"] == third
    assert tags["x"] is None
    spec = result.partition_tags[first]
    assert spec.backend_id == "RustConvBackend"


def test_ops_to_not_decompose_filters_unsupported_convs():
    """RustConv alone (see test_lowering_call.py for how that is decided)."""
    ep = export(Unsupported(), (torch.randn(1, 4, 8), torch.randn(1, 4, 6, 6)))
    ops, keep = RustConvPartitioner()._keep_where_taken(ep)
    assert torch.ops.aten.conv1d.default in ops and torch.ops.aten.conv1d.padding in ops
    conv_nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert not any(keep(n) for n in conv_nodes)

    ep = export(nn.Sequential(nn.Conv1d(4, 4, 3)), (torch.randn(1, 4, 8),))
    assert [keep(n) for n in ep.graph.nodes if n.op == "call_function"] == [True]


def test_weight_that_is_an_input_becomes_a_delegate_input():
    class M(nn.Module):
        def forward(self, w, x, b):
            return F.conv1d(x, w, b, padding=1)

    w, x, b = torch.randn(5, 4, 3), torch.randn(2, 4, 9), torch.randn(5)
    edge = lower(M(), (w, x, b), "transform")
    (lm,) = lowered_modules(edge)
    graph = blob_graph(lm)
    names = [graph.values[i].name.decode() for i in graph.inputs]
    assert names == ["w", "x", "b"]  # placeholder order = delegate input order
    call = next(
        n
        for n in edge.exported_program().graph.nodes
        if "executorch_call_delegate" in str(n.target)
    )
    assert [a.name for a in call.args[1:]] == names
    conv = graph.nodes[0].op
    assert (conv.weight, conv.input, conv.bias) == tuple(graph.inputs)
    assert_blob_matches_subgraph(lm)


class SharedPad(nn.Module):
    """One pad feeding two convs: not fusable (a pad fuses into a single conv)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(4, 4, 3)
        self.b = nn.Conv1d(4, 4, 3)

    def forward(self, x):
        p = F.pad(x, (2, 0))
        return self.a(p), self.b(p)


def _pad_and_conv_tags(ep):
    tags = _tags(ep)
    pads = [tags[n] for n in tags if "constant_pad_nd" in n]
    convs = [tags[n] for n in tags if "convolution" in n]
    return pads, convs


def test_pad_with_two_users_is_not_fused():
    ep = to_edge(export(SharedPad(), (torch.randn(1, 4, 8),))).exported_program()
    pads, convs = _pad_and_conv_tags(RustConvPartitioner().partition(ep).tagged_exported_program)
    assert pads == [None]
    assert len(convs) == 2 and None not in convs
