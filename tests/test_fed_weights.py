"""Conv weights fed at run time: a conv whose weight (and bias) is a model
input, and transformers' `Lfm2ShortConv`, whose weight reaches the delegate
as an input when the model reshapes it outside (`weight.squeeze(1)
.unsqueeze(1)`). Each call reads that call's weights: two different weights
through one loaded program give each its own result, at decode and prefill
lengths and on every path the runtime has for them (the channels-last walk
LFM2 takes from N = 32 on gave outputs off by their whole scale before)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, assert_delegated, run_pte_runner, run_runtime, save
from executorch.exir import to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from torch.export import export


def _lower(model, example):
    program = to_edge_transform_and_lower(
        export(model, example), partitioner=[RustConvPartitioner()]
    ).to_executorch()
    assert_delegated(program, ops=("convolution",))
    return program


class FedDepthwise(torch.nn.Module):
    """LFM2's short conv with its weight and bias as inputs:
    `c * conv(b * x)` between `[B, N, 3D]` and `[B, N, D]`, causal."""

    def forward(self, bcx, w, bias):
        b, c, x = bcx.transpose(-1, -2).chunk(3, dim=-2)
        n = bcx.shape[1]
        y = F.conv1d(b * x, w, bias, padding=w.shape[-1] - 1, groups=w.shape[0])[..., :n]
        return (c * y).transpose(-1, -2)


class FedDense(torch.nn.Module):
    def forward(self, x, w, bias):
        return torch.relu(F.conv1d(x, w, bias, padding=w.shape[-1] - 1)[..., : x.shape[-1]])


@pytest.mark.parametrize("n", [1, 8, 32, 64])
def test_depthwise_weight_and_bias_fed_as_inputs(n, tmp_path):
    d, k = 48, 3
    gen = torch.Generator().manual_seed(n)
    bcx = torch.randn(1, n, 3 * d, generator=gen)
    model = FedDepthwise().eval()
    weights = [
        (torch.randn(d, 1, k, generator=gen), torch.randn(d, generator=gen)) for _ in range(2)
    ]
    pte = save(_lower(model, (bcx, *weights[0])), tmp_path)
    for w, bias in weights:
        want = model(bcx, w, bias)
        assert_close(run_runtime(pte, (bcx, w, bias))[0], want, f"runtime N={n}")
        assert_close(run_pte_runner(pte, (bcx, w, bias), tmp_path)[0], want, f"runner N={n}")


@pytest.mark.parametrize("n", [1, 4, 40])
def test_dense_weight_and_bias_fed_as_inputs(n, tmp_path):
    ci, co, k = 24, 20, 5
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(1, ci, n, generator=gen)
    model = FedDense().eval()
    weights = [
        (torch.randn(co, ci, k, generator=gen) * 0.2, torch.randn(co, generator=gen))
        for _ in range(2)
    ]
    pte = save(_lower(model, (x, *weights[0])), tmp_path)
    for w, bias in weights:
        want = model(x, w, bias)
        assert_close(run_runtime(pte, (x, w, bias))[0], want, f"runtime N={n}")


@pytest.mark.parametrize("n", [17, 32, 64])
def test_transformers_lfm2_short_conv_matches_eager(n, tmp_path):
    """Upstream code: the conv weight goes through `squeeze(1)` and
    `unsqueeze(1)` in the model (its `causal_conv1d_fn` fallback)."""
    modeling = pytest.importorskip("transformers.models.lfm2.modeling_lfm2")
    from transformers.models.lfm2.configuration_lfm2 import Lfm2Config

    torch.manual_seed(0)
    d = 64
    conv = modeling.Lfm2ShortConv(Lfm2Config(hidden_size=d, conv_L_cache=3), layer_idx=0).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(x)

    model = Wrapped().eval()
    x = torch.randn(1, n, d)
    pte = save(_lower(model, (x,)), tmp_path)
    with torch.no_grad():
        want = model(x)
    scale = want.abs().max().item()
    assert_close(run_runtime(pte, (x,))[0], want, f"N={n}", atol=1e-4 * max(1.0, scale))
    assert_close(
        run_pte_runner(pte, (x,), tmp_path)[0], want, f"runner N={n}", atol=1e-4 * max(1.0, scale)
    )
