"""Every registered op kind, next to a convolution: taken, lowered, and correct.

Each case is a small function of the conv output ``y [1, 4, 8]`` and the
input ``x``; the test checks that nothing but the delegate call is left in
the lowered program, that the blob holds the expected node kinds, and that
the lowered program (reference interpreter) equals eager.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rustconv.fb.Op import Op
from rustconv.fb.UnaryOp import UnaryOp
from rustconv_test_helpers import (
    blob_graph,
    lower,
    lowered_modules,
    run_lowered,
    structured_inputs,
    top_level_targets,
)
from torch import nn
from torch.export import Dim

B, C, N = 1, 4, 8


class AroundConv(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.conv = nn.Conv1d(C, C, 3, padding=1)
        self.bias = nn.Parameter(torch.randn(C, 1))
        self.fn = fn

    def forward(self, x):
        return self.fn(self, self.conv(x), x)


CASES = {
    # unary
    "neg": (lambda m, y, x: -y, {Op.Unary}),
    "abs": (lambda m, y, x: y.abs(), {Op.Unary}),
    "relu": (lambda m, y, x: torch.relu(y), {Op.Unary}),
    "sigmoid": (lambda m, y, x: torch.sigmoid(y), {Op.Unary}),
    "tanh": (lambda m, y, x: torch.tanh(y), {Op.Unary}),
    "silu": (lambda m, y, x: F.silu(y), {Op.Unary, Op.Binary}),
    "gelu": (lambda m, y, x: F.gelu(y), {Op.Unary}),
    "gelu_tanh": (lambda m, y, x: F.gelu(y, approximate="tanh"), {Op.Unary}),
    "exp": (lambda m, y, x: torch.exp(y), {Op.Unary}),
    "log": (lambda m, y, x: torch.log(y.abs() + 1), {Op.Unary, Op.Binary}),
    "log1p": (lambda m, y, x: torch.log1p(y.abs()), {Op.Unary}),
    "softplus": (lambda m, y, x: F.softplus(y), {Op.Unary, Op.Binary, Op.Where}),
    "sqrt": (lambda m, y, x: torch.sqrt(y.abs()), {Op.Unary}),
    "rsqrt": (lambda m, y, x: torch.rsqrt(y.abs() + 1), {Op.Unary, Op.Binary}),
    "reciprocal": (lambda m, y, x: torch.reciprocal(y.abs() + 1), {Op.Unary, Op.Binary}),
    # binary, scalars and broadcasting
    "add": (lambda m, y, x: y + x, {Op.Binary}),
    "add_scalar": (lambda m, y, x: y + 2.5, {Op.Binary}),
    "add_alpha": (lambda m, y, x: torch.add(y, x, alpha=2), {Op.Binary}),
    "sub_alpha_scalar": (lambda m, y, x: torch.sub(y, 1.5, alpha=3), {Op.Binary}),
    "rsub": (lambda m, y, x: 1 - y, {Op.Binary}),
    "rsub_alpha": (lambda m, y, x: torch.rsub(y, x, alpha=2), {Op.Binary}),
    "mul_scalar": (lambda m, y, x: 2 * y, {Op.Binary}),
    "div": (lambda m, y, x: y / (x.abs() + 1), {Op.Binary, Op.Unary}),
    "div_scalar": (lambda m, y, x: y / 4.0, {Op.Binary}),
    "maximum": (lambda m, y, x: torch.maximum(y, x), {Op.Binary}),
    "minimum": (lambda m, y, x: torch.minimum(y, x), {Op.Binary}),
    "broadcast_param": (lambda m, y, x: y * m.bias, {Op.Binary}),
    "broadcast_row": (lambda m, y, x: y + x[:, :1, :], {Op.Binary, Op.Slice}),
    # comparisons and where
    "where_scalar": (lambda m, y, x: torch.where(y > 0, y, 0.0), {Op.Binary, Op.Where}),
    "where_tensors": (lambda m, y, x: torch.where(y >= x, x, y), {Op.Binary, Op.Where}),
    "where_both_scalars": (lambda m, y, x: torch.where(y < 0.5, 1.0, 2.0), {Op.Binary, Op.Where}),
    "where_eq_ne_le": (
        lambda m, y, x: (
            torch.where(y == x, 1.0, y) + torch.where(y != 0, y, 3.0) + torch.where(y <= x, y, x)
        ),
        {Op.Binary, Op.Where},
    ),  # fmt: skip
    "mask_cast": (lambda m, y, x: (y > 0).float() * y, {Op.Binary}),
    # clamp family
    "clamp": (lambda m, y, x: torch.clamp(y, -0.5, 0.5), {Op.Clamp}),
    "clamp_min": (lambda m, y, x: torch.clamp(y, min=0.1), {Op.Clamp}),
    "hardtanh": (lambda m, y, x: F.hardtanh(y, -2.0, 0.3), {Op.Clamp}),
    "relu6": (lambda m, y, x: F.relu6(y * 4), {Op.Clamp, Op.Binary}),
    # constants
    "full_like": (lambda m, y, x: y + torch.full_like(y, 2.0), {Op.Full, Op.Binary}),
    "zeros_ones_like": (
        lambda m, y, x: y * torch.ones_like(y) + torch.zeros_like(x),
        {Op.Full, Op.Binary},
    ),
    # views
    "transpose_back": (lambda m, y, x: y.transpose(1, 2).relu().transpose(1, 2), {Op.Permute}),
    "permute_out": (lambda m, y, x: y.permute(0, 2, 1) * 2, {Op.Permute, Op.Binary}),
    "slice_negative": (lambda m, y, x: y[..., -3:] + x[..., :3], {Op.Slice, Op.Binary}),
    "slice_step": (lambda m, y, x: y[:, 1:, ::2] * 2, {Op.Slice, Op.Binary}),
    "unsqueeze_squeeze": (
        lambda m, y, x: (y.unsqueeze(0) * 2).squeeze(0),
        {Op.Reshape, Op.Binary},
    ),
    "view_drop_batch": (lambda m, y, x: y.view(C, N) + 1, {Op.Reshape, Op.Binary}),
    "chunk": (lambda m, y, x: (lambda a, b: a * b)(*y.chunk(2, dim=1)), {Op.Slice, Op.Binary}),
    "split_sizes": (
        lambda m, y, x: (lambda a, b: torch.cat([b, a], dim=2))(*torch.split(y, [3, 5], dim=2)),
        {Op.Slice, Op.Cat},
    ),
    "cat_channels": (lambda m, y, x: torch.cat([y, x], dim=1) * 2, {Op.Cat, Op.Binary}),
    "cat_time": (lambda m, y, x: torch.cat([x, y, x], dim=-1), {Op.Cat}),
    # copies
    "clone_contiguous_to": (
        lambda m, y, x: y.clone() + y.contiguous() + y.to(torch.float32),
        {Op.Binary},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_is_taken_and_matches_eager(name):
    fn, expected_ops = CASES[name]
    torch.manual_seed(0)
    model = AroundConv(fn).eval()
    edge = lower(model, (torch.randn(B, C, N),), "to_edge")
    left = [t for t in top_level_targets(edge) if t not in ("executorch_call_delegate", "getitem")]
    assert left == []
    (lm,) = lowered_modules(edge)
    op_types = {n.opType for n in blob_graph(lm).nodes}
    assert expected_ops <= op_types, op_types
    for kind, (x,) in structured_inputs([(B, C, N)]).items():
        (got,), _ = run_lowered(edge, [x])
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4, msg=kind)


def test_unary_codes():
    model = AroundConv(lambda m, y, x: F.gelu(F.softplus(y), approximate="tanh"))
    edge = lower(model.eval(), (torch.randn(B, C, N),), "transform")
    (lm,) = lowered_modules(edge)
    codes = [n.op.op for n in blob_graph(lm).nodes if n.opType == Op.Unary]
    assert codes == [UnaryOp.Softplus, UnaryOp.GeluTanh]


def test_scalar_operands_use_index_minus_one():
    model = AroundConv(lambda m, y, x: torch.where(y > 0.25, y * 3.0, -1.0))
    edge = lower(model.eval(), (torch.randn(B, C, N),), "to_edge")
    (lm,) = lowered_modules(edge)
    graph = blob_graph(lm)
    gt, mul, where = (n.op for n in graph.nodes if n.opType in (Op.Binary, Op.Where))
    assert (gt.b, gt.bScalar) == (-1, 0.25)
    assert (mul.b, mul.bScalar) == (-1, 3.0)
    assert (where.b, where.bScalar) == (-1, -1.0)
    # The mask is written in the float dtype of what it compares.
    assert graph.values[gt.output].dtype == 0


def test_dynamic_slices_use_python_style_bounds():
    class Cuts(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(C, C, 3)

        def forward(self, x):
            y = self.conv(x)  # length n - 2
            n = x.shape[-1]
            head, tail = y[..., : n - 4], y[..., -2:]
            return torch.cat([tail, head], dim=-1) * 2

    seq = Dim("seq", min=6, max=64)
    torch.manual_seed(0)
    model = Cuts().eval()
    edge = lower(model, (torch.randn(B, C, 16),), "to_edge", dynamic_shapes=({2: seq},))
    (lm,) = lowered_modules(edge)
    slices = [n.op for n in blob_graph(lm).nodes if n.opType == Op.Slice]
    # y[..., :n - 4] of a length n - 2 is "up to 2 before the end".
    assert sorted((s.start, s.end) for s in slices) == [(-2, 2**63 - 1), (0, -2)]
    for n in (6, 9, 40):
        x = torch.randn(B, C, n)
        (got,), _ = run_lowered(edge, [x])
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=0)


def test_conv_then_padding_slice_folds_into_the_conv():
    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(C, C, 4, padding=3, groups=C)

        def forward(self, x):
            return self.conv(x)[..., 1 : x.shape[-1] + 1]

    seq = Dim("seq", min=4, max=64)
    model = Causal().eval()
    edge = lower(model, (torch.randn(B, C, 16),), "to_edge", dynamic_shapes=({2: seq},))
    (lm,) = lowered_modules(edge)
    (node,) = blob_graph(lm).nodes
    assert node.opType == Op.Conv1d
    assert (node.op.padLeft, node.op.padRight) == (2, 1)
    handles = {
        n.meta["debug_handle"]
        for n in lm.original_module.graph.nodes
        if n.op == "call_function" and isinstance(n.meta["val"], torch.Tensor)
    }  # the SymInt nodes compute nothing at run time and have no blob node
    assert set(int(h) for h in node.debugHandles) == handles
    for n in (4, 13):
        x = torch.randn(B, C, n)
        (got,), _ = run_lowered(edge, [x])
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=0)


def test_dynamic_reshapes_and_permutes_follow_the_run_time_length():
    class Views(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(C, C, 3, padding=1)

        def forward(self, x):  # x [1, N, C]
            y = self.conv(x.transpose(1, 2))  # [1, C, N]
            z = y.unsqueeze(1) * self_scale(y)  # [1, 1, C, N]
            return z.squeeze(1).permute(2, 0, 1).reshape(-1, 1, C)  # [N, 1, C]

    def self_scale(y):
        return torch.sigmoid(y.unsqueeze(1))

    seq = Dim("seq", min=2, max=64)
    torch.manual_seed(0)
    model = Views().eval()
    edge = lower(model, (torch.randn(B, 16, C),), "to_edge", dynamic_shapes=({1: seq},))
    assert [t for t in top_level_targets(edge) if "delegate" not in t and t != "getitem"] == []
    (lm,) = lowered_modules(edge)
    assert Op.Reshape in {n.opType for n in blob_graph(lm).nodes}
    for n in (2, 7, 33):
        x = torch.randn(B, n, C)
        (got,), _ = run_lowered(edge, [x])
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=0)
