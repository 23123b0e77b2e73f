"""Tensors computed from constants are evaluated at export (ops_lowering/folding.py),
and BatchNorm in eval mode becomes constants (ops_lowering/batch_norm.py).

Each test checks what the blob holds (the weight a ``Constant`` value, not a
delegate input), which nodes were taken, and the lowered program's result
against eager (RustConv delegates run by the reference interpreter).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge
from rustconv import RustConvPartitioner
from rustconv.export.ops_lowering import GraphContext, OpLowering, aten_op, registry
from rustconv.export.ops_lowering.folding import constant_reason
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.Op import Op
from rustconv.fb.ValueKind import ValueKind
from rustconv_test_helpers import (
    assert_blob_matches_subgraph,
    blob_graph,
    export,
    lower,
    lowered_modules,
    run_lowered,
)
from torch import nn

FLOWS = ("to_edge", "transform")


def _explain(model, *inputs) -> dict[str, str]:
    return RustConvPartitioner().explain(to_edge(export(model, inputs)).exported_program())


def _conv_weight_kinds(lm) -> list[int]:
    graph = blob_graph(lm)
    return [graph.values[node.op.weight].kind for node in graph.nodes if node.opType == Op.Conv1d]


def _check(model, inputs, flow, *, calls=1, atol=1e-5):
    edge = lower(model, inputs, flow)
    lms = lowered_modules(edge)
    assert len(lms) == calls
    for lm in lms:
        assert_blob_matches_subgraph(lm)
    got, _ = run_lowered(edge, list(inputs))
    want = model(*inputs)
    torch.testing.assert_close(got[0], want, atol=atol, rtol=1e-5)
    return edge, lms


class ViewedWeight(nn.Module):
    """The weight views of transformers' Lfm2ShortConv, plus flip, permute and a cast."""

    def __init__(self, form: str, channels=8, k=3):
        super().__init__()
        self.form = form
        self.conv = nn.Conv1d(channels, channels, k, groups=channels, bias=False)
        self.w_t = nn.Parameter(torch.randn(1, channels, k))  # [in/groups, out, K]
        self.w_half = nn.Parameter(torch.randn(channels, 1, k).half())
        self.k = k

    def weight(self):
        if self.form == "squeeze_unsqueeze":
            return self.conv.weight.squeeze(1).unsqueeze(1)
        if self.form == "flip":
            return self.conv.weight.flip(-1)
        if self.form == "permute":
            return self.w_t.permute(1, 0, 2)
        if self.form == "cast":
            return self.w_half.float()
        raise ValueError(self.form)

    def forward(self, x):
        y = F.conv1d(F.pad(x, (self.k - 1, 0)), self.weight(), groups=x.shape[1])
        return y * torch.sigmoid(x)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("form", ["squeeze_unsqueeze", "flip", "permute", "cast"])
def test_weight_computed_from_parameters_is_one_constant(form, flow):
    torch.manual_seed(0)
    model = ViewedWeight(form).eval()
    x = torch.randn(1, 8, 40)
    _, (lm,) = _check(model, (x,), flow)
    assert _conv_weight_kinds(lm) == [ValueKind.Constant]
    # The call's only input is x: the weight's chain is inside, evaluated.
    assert len(blob_graph(lm).inputs) == 1
    assert not any("squeeze" in n or "permute" in n for n in _explain(model, x))


class ChunkedWeights(nn.Module):
    """Two convs' weights cut from one fused parameter."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 1, 3))

    def forward(self, x):
        w1, w2 = self.w.chunk(2, dim=0)
        y = F.conv1d(x, w1, padding=1, groups=8)
        return F.conv1d(torch.relu(y), w2, padding=1, groups=8)


@pytest.mark.parametrize("flow", FLOWS)
def test_pieces_of_a_split_parameter_are_constants(flow):
    torch.manual_seed(0)
    model = ChunkedWeights().eval()
    x = torch.randn(1, 8, 20)
    _, (lm,) = _check(model, (x,), flow)
    assert _conv_weight_kinds(lm) == [ValueKind.Constant] * 2
    assert len(blob_graph(lm).inputs) == 1


def test_weight_normalization_chain_is_taken_and_evaluated():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3, padding=1)), nn.ReLU()
    ).eval()
    x = torch.randn(1, 4, 16)
    reasons = _explain(model, x)
    assert reasons == {}, reasons  # pow, sum, div, mul: all taken
    _, (lm,) = _check(model, (x,), "to_edge")
    assert _conv_weight_kinds(lm) == [ValueKind.Constant]


class SharedChain(nn.Module):
    """A weight view that something outside RustConv also reads."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 1, 3))

    def forward(self, x):
        view = self.w.squeeze(1)
        y = F.conv1d(x, view.unsqueeze(1), padding=1, groups=8)
        return y, torch.cumsum(view, -1)


def test_weight_chain_shared_with_outside_stays_an_input():
    """The shared view stays outside (a partitioner may not duplicate nodes);
    the conv reads its weight as a delegate input, at run time."""
    torch.manual_seed(0)
    model = SharedChain().eval()
    x = torch.randn(1, 8, 12)
    reasons = _explain(model, x)
    assert "also reads" in reasons["aten_squeeze_copy_dims"]
    assert "computed by aten_squeeze_copy_dims outside" in reasons["aten_unsqueeze_copy_default"]
    edge = lower(model, (x,), "to_edge")
    (lm,) = lowered_modules(edge)
    assert _conv_weight_kinds(lm) == [ValueKind.Input]
    (got, _), _ = run_lowered(edge, [x])
    torch.testing.assert_close(got, model(x)[0], atol=1e-5, rtol=1e-5)


def test_constant_larger_than_its_sources_is_not_evaluated():
    class Expanded(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)
            self.b = nn.Parameter(torch.randn(4, 1))

        def forward(self, x):
            return self.conv(x) + self.b.expand(1, 4, x.shape[-1])

    model = Expanded().eval()
    reasons = _explain(model, torch.randn(1, 4, 64))
    (name,) = [n for n in reasons if "expand" in n]
    assert "larger than what it reads" in reasons[name]


class OnConstants(nn.Module):
    """A conv and a matmul whose every operand is a parameter."""

    def __init__(self):
        super().__init__()
        self.x = nn.Parameter(torch.randn(1, 4, 16))
        self.w = nn.Parameter(torch.randn(4, 4, 3))
        self.a = nn.Parameter(torch.randn(4, 4))

    def forward(self, y):
        return F.conv1d(self.x, self.w) + y, torch.mm(self.a, self.a)


def test_anchors_on_constants_are_asked_of_the_registry(monkeypatch):
    """folding takes its anchors from the op registry: registering a new
    anchor lowering (here a stand-in for ``aten.mm``) is all it takes for
    folding to leave that op to the delegate instead of evaluating it."""
    ep = export(OnConstants(), (torch.randn(1, 4, 14),))
    ctx = GraphContext(ep)
    (conv,) = [n for n in ep.graph.nodes if aten_op(n) == torch.ops.aten.conv1d.default]
    (mm,) = [n for n in ep.graph.nodes if aten_op(n) == torch.ops.aten.mm.default]
    assert "anchor" in constant_reason(conv, ctx)
    assert constant_reason(mm, ctx) is None

    class MatmulAnchor(OpLowering):
        kind = "mm"
        targets = (torch.ops.aten.mm.default,)
        is_anchor = True

    monkeypatch.setitem(registry._BY_TARGET, torch.ops.aten.mm.default, MatmulAnchor())
    assert "anchor" in constant_reason(mm, GraphContext(ep))


class ConvBatchNorm(nn.Module):
    def __init__(self, between=None, share=False, bias=True, channels=6):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 5, padding=2, groups=2, bias=bias)
        self.bn = nn.BatchNorm1d(channels)
        self.between = between
        self.share = share
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.normal_()
            self.bn.bias.normal_()

    def forward(self, x):
        y = self.conv(x)
        z = self.bn(y if self.between is None else self.between(y))
        return z + y if self.share else torch.nn.functional.silu(z)


def _binary_ops_on_constants(lm) -> list[int]:
    """The ops of the Binary nodes reading a Constant (a BatchNorm's scale, shift)."""
    graph = blob_graph(lm)
    return [
        n.op.op
        for n in graph.nodes
        if n.opType == Op.Binary
        and any(i >= 0 and graph.values[i].kind == ValueKind.Constant for i in (n.op.a, n.op.b))
    ]


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("bias", [True, False])
def test_batch_norm_after_a_conv_is_folded_into_it(bias, flow):
    torch.manual_seed(0)
    model = ConvBatchNorm(bias=bias).eval()
    x = torch.randn(2, 6, 20)
    _, (lm,) = _check(model, (x,), flow)
    assert (
        _binary_ops_on_constants(lm) == []
    )  # nothing left of the BatchNorm but the conv's constants
    graph = blob_graph(lm)
    (conv,) = [n for n in graph.nodes if n.opType == Op.Conv1d]
    assert graph.values[conv.op.bias].kind == ValueKind.Constant


class _Copy(nn.Module):
    def forward(self, y):
        return y.clone()


@pytest.mark.parametrize("case", ["after_relu", "conv_read_twice", "conv_read_through_a_copy"])
def test_batch_norm_elsewhere_is_a_per_channel_affine(case):
    torch.manual_seed(0)
    model = {
        "after_relu": lambda: ConvBatchNorm(between=nn.ReLU()),
        "conv_read_twice": lambda: ConvBatchNorm(share=True),
        "conv_read_through_a_copy": lambda: ConvBatchNorm(between=_Copy(), share=True),
    }[case]().eval()
    x = torch.randn(1, 6, 20)
    _, (lm,) = _check(model, (x,), "to_edge")
    assert _binary_ops_on_constants(lm) == [BinaryOp.Mul, BinaryOp.Add]


def test_batch_norm_with_statistics_from_an_input_is_refused():
    class InputStats(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x, mean):
            var = torch.ones(4)
            return F.batch_norm(self.conv(x), mean, var, training=False)

    model = InputStats().eval()
    reasons = _explain(model, torch.randn(1, 4, 8), torch.randn(4))
    (name,) = [n for n in reasons if "batch_norm" in n]
    assert "is not a constant" in reasons[name]
