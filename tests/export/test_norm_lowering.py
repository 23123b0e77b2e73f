"""Normalisations and reductions next to a convolution: taken, lowered to
``Reduce`` plus elementwise nodes, grouped so no reduction reads its own
kernel's anchor, and correct (reference interpreter against eager); and the
forms refused, with their reasons."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from rustconv import RustConvPartitioner
from rustconv.export.fusion import check_kernels
from rustconv.export.ir import IRGraph, IRNode
from rustconv.export.lowering import lower_program
from rustconv.fb.Op import Op
from rustconv.fb.ReduceOp import ReduceOp
from rustconv_test_helpers import (
    blob_graph,
    lower,
    lowered_modules,
    run_lowered,
    structured_inputs,
    top_level_targets,
)
from torch import nn
from torch.export import Dim, export
from transformers.models.lfm2.modeling_lfm2 import Lfm2RMSNorm

B, C, N = 1, 8, 12


class AroundConv(nn.Module):
    """``fn(module, conv(x), x)``, then a second conv: the norm sits between
    two anchors, as in the models (the second conv's prologue)."""

    def __init__(self, fn, second=True):
        super().__init__()
        self.conv = nn.Conv1d(C, C, 3, padding=1)
        self.second = nn.Conv1d(C, C, 3, padding=1) if second else None
        self.w = nn.Parameter(1 + 0.5 * torch.randn(C))
        self.b = nn.Parameter(0.5 * torch.randn(C))
        self.rms = Lfm2RMSNorm(C, eps=1e-5)
        with torch.no_grad():
            self.rms.weight.copy_(1 + 0.5 * torch.randn(C))
        self.fn = fn

    def forward(self, x):
        y = self.fn(self, self.conv(x), x)
        return self.second(y) if self.second is not None else y


def _t(y):
    return y.transpose(1, 2)


def _ln_items(m, y, x):
    out, mean, rstd = torch.native_layer_norm(_t(y), [C], m.w, None, 1e-5)
    return _t(out * 2 + mean * rstd)


CASES = {
    # LayerNorm over the channels, wav2vec2's way (through transposes)
    "layer_norm_channels": lambda m, y, x: _t(F.layer_norm(_t(y), (C,), m.w, m.b)),
    "layer_norm_no_affine": lambda m, y, x: _t(F.layer_norm(_t(y), (C,))),
    "layer_norm_weight_only": lambda m, y, x: _t(F.layer_norm(_t(y), (C,), m.w)),
    "layer_norm_gelu": lambda m, y, x: F.gelu(_t(F.layer_norm(_t(y), (C,), m.w, m.b))),
    "layer_norm_over_time": lambda m, y, x: F.layer_norm(y, (N,)),
    "layer_norm_two_dims": lambda m, y, x: F.layer_norm(y, (C, N)),
    "layer_norm_mean_rstd": _ln_items,
    # GroupNorm: one group per channel (over time), one group of all
    "group_norm_per_channel": lambda m, y, x: F.group_norm(y, C, m.w, m.b),
    "group_norm_one_group": lambda m, y, x: F.group_norm(y, 1, m.w, m.b),
    # RMSNorm: torch's (decomposed by the edge dialect) and transformers' LFM2
    "rms_norm": lambda m, y, x: _t(F.rms_norm(_t(y), (C,), m.w, eps=1e-6)),
    "rms_norm_default_eps": lambda m, y, x: _t(F.rms_norm(_t(y), (C,))),
    "lfm2_rms_norm": lambda m, y, x: _t(m.rms(_t(y))),
    # the reductions models write by hand
    "mean_no_keepdim": lambda m, y, x: y - y.mean(-1).unsqueeze(-1),
    "sum_keepdim": lambda m, y, x: y * y.sum(1, keepdim=True),
    "var_unbiased": lambda m, y, x: y * y.var(-1, keepdim=True),
    "var_biased": lambda m, y, x: y * torch.var(y, 1, correction=0, keepdim=True),
    "manual_layer_norm": lambda m, y, x: (
        (y - y.mean(1, keepdim=True)) / torch.sqrt(y.var(1, unbiased=False, keepdim=True) + 1e-5)
    ),
    # powers
    "pow_2": lambda m, y, x: y.pow(2),
    "pow_half": lambda m, y, x: y.abs().pow(0.5),
    "pow_minus_half": lambda m, y, x: (y.abs() + 1).pow(-0.5),
    "pow_minus_one": lambda m, y, x: (y.abs() + 1).pow(-1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_norm_is_taken_and_matches_eager(name):
    torch.manual_seed(0)
    model = AroundConv(CASES[name]).eval()
    edge = lower(model, (torch.randn(B, C, N),), "to_edge")
    left = [t for t in top_level_targets(edge) if t not in ("executorch_call_delegate", "getitem")]
    assert left == []
    (lm,) = lowered_modules(edge)
    graph = blob_graph(lm)
    if not name.startswith("pow"):
        assert Op.Reduce in {n.opType for n in graph.nodes}
    for kind, (x,) in structured_inputs([(B, C, N)]).items():
        (got,), _ = run_lowered(edge, [x])
        want = model(x)
        scale = max(1.0, want.abs().max().item())
        torch.testing.assert_close(got, want, atol=1e-4 * scale, rtol=1e-4, msg=f"{name} {kind}")


def _kernels(graph):
    """Per kernel: its anchor's op (or None) and the reductions in it."""
    kernels: dict[int, dict] = {}
    for node in graph.nodes:
        k = kernels.setdefault(node.kernel, {"anchor": None, "reduce": []})
        if node.opType in (Op.Conv1d, Op.LinearScan):
            k["anchor"] = node.opType
        if node.opType == Op.Reduce:
            k["reduce"].append(node.op.op)
    return kernels


@pytest.mark.parametrize("flow", ["to_edge", "transform"])
def test_conv_norm_activation_conv_is_one_call_with_the_norm_in_the_second_convs_kernel(flow):
    """The LayerNorm between two convs joins the second conv's kernel (its
    prologue, after its statistics), with its mean and variance as one
    reduction group; the first conv's kernel holds no reduction."""
    torch.manual_seed(0)
    model = AroundConv(CASES["layer_norm_gelu"]).eval()
    partitioners = None
    if flow == "transform":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioners = [RustConvPartitioner(), XnnpackPartitioner()]
    edge = lower(model, (torch.randn(B, C, N),), flow, partitioners=partitioners)
    assert top_level_targets(edge).count("executorch_call_delegate") == 1
    (lm,) = lowered_modules(edge)
    kernels = _kernels(blob_graph(lm))
    assert len(kernels) == 2, kernels
    first, second = kernels[0], kernels[1]
    assert first["reduce"] == [] and first["anchor"] == Op.Conv1d
    assert second["anchor"] == Op.Conv1d
    assert sorted(second["reduce"]) == [ReduceOp.Mean, ReduceOp.Var]


def test_a_norm_of_the_last_conv_is_a_pass_kernel():
    """With no conv after it, the norm (and what follows) is a pass kernel
    of its own, reading the conv's stored output."""
    torch.manual_seed(0)
    model = AroundConv(CASES["group_norm_per_channel"], second=False).eval()
    edge = lower(model, (torch.randn(B, C, N),), "to_edge")
    (lm,) = lowered_modules(edge)
    kernels = _kernels(blob_graph(lm))
    assert [k["anchor"] for k in kernels.values()] == [Op.Conv1d, None]
    assert kernels[0]["reduce"] == [] and len(kernels[1]["reduce"]) == 2


def test_check_kernels_refuses_a_reduction_of_its_own_anchor():
    torch.manual_seed(0)
    model = AroundConv(CASES["group_norm_per_channel"], second=False).eval()
    edge = lower(model, (torch.randn(B, C, N),), "to_edge")
    (lm,) = lowered_modules(edge)
    ir = lower_program(lm.original_module)
    nodes = [IRNode(n.op_type, n.op, n.name, n.debug_handles, 0) for n in ir.nodes]
    problem = check_kernels(IRGraph(ir.values, nodes, ir.inputs, ir.outputs))
    assert problem is not None and "reads the anchor of its own kernel 0" in problem, problem


class _Refused(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.conv = nn.Conv1d(C, C, 3, padding=1)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.conv(x))


@pytest.mark.parametrize(
    "fn, node, reason",
    [
        (lambda y: F.group_norm(y, 2), "native_group_norm", "GroupNorm of 2 groups of 8 channels"),
        (lambda y: y.pow(3), "pow", "pow with exponent 3"),
        (lambda y: y + y.mean(dim=(0, 1, 2)), "mean_dim", "reduces every dimension to a 0-d"),
        (lambda y: y * y.mean(-1, dtype=torch.float16, keepdim=True).float(), "mean_dim",
         "mixed dtypes"),
    ],
)  # fmt: skip
def test_forms_refused_with_a_reason(fn, node, reason):
    ep = export(_Refused(fn).eval(), (torch.randn(B, C, N),))
    from executorch.exir import to_edge

    explained = RustConvPartitioner().explain(to_edge(ep).exported_program())
    found = {k: v for k, v in explained.items() if node in k}
    assert found and any(reason in v for v in found.values()), explained


def test_unbiased_variance_over_a_dynamic_length_is_refused_biased_taken():
    seq = Dim("seq", min=4, max=64)
    dynamic = {"x": {2: seq}}

    def reason(fn):
        ep = export(_Refused(fn).eval(), (torch.randn(B, C, N),), dynamic_shapes=dynamic)
        from executorch.exir import to_edge

        explained = RustConvPartitioner().explain(to_edge(ep).exported_program())
        return {k: v for k, v in explained.items() if "var" in k}

    assert "over a dynamic dimension" in str(reason(lambda y: y * y.var(-1, keepdim=True)))
    assert reason(lambda y: y * y.var(-1, unbiased=False, keepdim=True)) == {}
    assert reason(lambda y: y * y.var(1, keepdim=True)) == {}  # over the static channels


def test_layer_norm_follows_a_dynamic_length():
    torch.manual_seed(0)
    model = AroundConv(CASES["layer_norm_gelu"]).eval()
    seq = Dim("seq", min=4, max=64)
    edge = lower(model, (torch.randn(B, C, N),), "to_edge", dynamic_shapes={"x": {2: seq}})
    for n in (4, 17, 64):
        x = torch.randn(B, C, n)
        (got,), _ = run_lowered(edge, [x])
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)


def test_float16_norms_match_float32_eager_to_fp16_rounding():
    torch.manual_seed(0)
    model = AroundConv(CASES["layer_norm_gelu"]).eval()
    half = copy.deepcopy(model).half()
    x = torch.randn(B, C, N)
    edge = lower(half, (x.half(),), "to_edge")
    left = [t for t in top_level_targets(edge) if t not in ("executorch_call_delegate", "getitem")]
    assert left == []
    (got,), _ = run_lowered(edge, [x.half()])
    torch.testing.assert_close(got.float(), model(x), atol=3e-2, rtol=3e-2)
