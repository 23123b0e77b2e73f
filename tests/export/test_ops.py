"""rustconv.linear_scan: eager semantics, validation, and export."""

from __future__ import annotations

import pytest
import rustconv  # noqa: F401  (registers the op)
import torch
from torch.export import Dim


def naive_scan(x0, a, u):
    y = torch.empty_like(a)
    B, C, N = a.shape
    for b in range(B):
        for c in range(C):
            state = x0[b, c].item()
            for t in range(N):
                state = a[b, c, t].item() * state + u[b, c, t].item()
                y[b, c, t] = state
    return y


def random_inputs(B=2, C=3, N=7, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(B, C, generator=g, dtype=dtype),
        torch.rand(B, C, N, generator=g, dtype=dtype),
        torch.randn(B, C, N, generator=g, dtype=dtype),
    )


@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 1, 1), (3, 2, 0), (1, 5, 33)])
def test_eager_matches_naive_loop(shape):
    x0, a, u = random_inputs(*shape)
    y = torch.ops.rustconv.linear_scan(x0, a, u)
    assert y.shape == a.shape and y.dtype == a.dtype and y.is_contiguous()
    torch.testing.assert_close(y, naive_scan(x0, a, u))


def test_eager_handles_non_contiguous_inputs():
    x0, a, u = random_inputs(2, 3, 6)
    a_t = a.transpose(0, 1).contiguous().transpose(0, 1)
    assert not a_t.is_contiguous()
    torch.testing.assert_close(torch.ops.rustconv.linear_scan(x0, a_t, u), naive_scan(x0, a, u))


def test_output_does_not_alias_inputs():
    x0, a, u = random_inputs()
    y = rustconv.linear_scan(x0, a, u)
    assert y.data_ptr() not in (x0.data_ptr(), a.data_ptr(), u.data_ptr())


@pytest.mark.parametrize(
    "x0_shape, a_shape, u_shape, match",
    [
        ((2, 3, 1), (2, 3, 4), (2, 3, 4), "x0 must be 2-D"),
        ((2, 3), (2, 3), (2, 3, 4), "a must be 3-D"),
        ((2, 3), (2, 3, 4), (2, 3, 5), "a and u must have the same shape"),
        ((2, 4), (2, 3, 4), (2, 3, 4), "x0 must be"),
    ],
)
def test_shape_errors(x0_shape, a_shape, u_shape, match):
    with pytest.raises(ValueError, match=match):
        torch.ops.rustconv.linear_scan(
            torch.zeros(x0_shape), torch.zeros(a_shape), torch.zeros(u_shape)
        )


def test_dtype_errors():
    x0, a, u = random_inputs()
    with pytest.raises(TypeError, match="same dtype"):
        torch.ops.rustconv.linear_scan(x0.double(), a, u)
    with pytest.raises(TypeError, match="unsupported dtype"):
        torch.ops.rustconv.linear_scan(x0.int(), a.int(), u.int())


class ScanModel(torch.nn.Module):
    def forward(self, x0, a, u):
        return torch.ops.rustconv.linear_scan(x0, a, u) * 2


def test_export_with_dynamic_sequence_length():
    seq = Dim("seq", max=128)
    x0, a, u = random_inputs(N=16)
    ep = torch.export.export(ScanModel(), (x0, a, u), dynamic_shapes=(None, {2: seq}, {2: seq}))
    scans = [
        n
        for n in ep.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.rustconv.linear_scan.default
    ]
    assert len(scans) == 1
    out_len = scans[0].meta["val"].shape[2]
    assert isinstance(out_len, torch.SymInt)

    # The exported program runs at other lengths within the bound.
    for n in (1, 16, 100):
        x0, a, u = random_inputs(N=n)
        torch.testing.assert_close(ep.module()(x0, a, u), 2 * naive_scan(x0, a, u))


def test_export_refuses_mismatched_static_shapes():
    x0, a, _ = random_inputs(N=8)
    u = torch.randn(2, 3, 9)
    with pytest.raises(Exception, match="same shape"):
        torch.export.export(ScanModel(), (x0, a, u))
