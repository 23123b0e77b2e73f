"""Property test: random chains of elementwise ops and broadcasts around a conv
and a scan lower to one RustConv call that computes what eager computes."""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.nn.functional as F
from rustconv_test_helpers import (
    lower,
    lowered_modules,
    run_lowered,
    structured_inputs,
    top_level_targets,
)
from torch import nn

C, N = 4, 12

# name -> f(h, operands) with operands: "ch" [C, 1], "time" [N], "row" [1, 1, N],
# "full" [1, C, N] (an input), all bounded so no chain overflows.
UNARY = {
    "neg": lambda h, o: -h,
    "abs": lambda h, o: h.abs(),
    "relu": lambda h, o: torch.relu(h),
    "sigmoid": lambda h, o: torch.sigmoid(h),
    "tanh": lambda h, o: torch.tanh(h),
    "silu": lambda h, o: F.silu(h),
    "gelu": lambda h, o: F.gelu(h),
    "gelu_tanh": lambda h, o: F.gelu(h, approximate="tanh"),
    "exp_tanh": lambda h, o: torch.exp(torch.tanh(h)),
    "log1p_abs": lambda h, o: torch.log1p(h.abs()),
    "sqrt_abs": lambda h, o: torch.sqrt(h.abs() + 0.5),
    "rsqrt": lambda h, o: torch.rsqrt(h.abs() + 1),
    "reciprocal": lambda h, o: torch.reciprocal(h.abs() + 1),
    "softplus": lambda h, o: F.softplus(h),
    "clamp": lambda h, o: torch.clamp(h, -1.5, 2.0),
    "hardtanh": lambda h, o: F.hardtanh(h),
}
BINARY = {
    "add_ch": lambda h, o: h + o["ch"],
    "sub_time": lambda h, o: h - o["time"],
    "mul_row": lambda h, o: h * o["row"],
    "div_ch": lambda h, o: h / (o["ch"].abs() + 1),
    "mul_full": lambda h, o: h * torch.tanh(o["full"]),
    "add_scalar": lambda h, o: h + 0.75,
    "rsub_scalar": lambda h, o: 2.0 - h,
    "mul_scalar": lambda h, o: h * 0.5,
    "maximum_row": lambda h, o: torch.maximum(h, o["row"]),
    "minimum_ch": lambda h, o: torch.minimum(h, o["ch"]),
    "where_gt": lambda h, o: torch.where(h > o["row"], h, o["ch"]),
    "where_scalar": lambda h, o: torch.where(h <= 0.1, 0.0, h),
    "add_alpha": lambda h, o: torch.add(h, o["full"], alpha=0.5),
}
OPS = {**UNARY, **BINARY}


def _chain(rng: random.Random, length: int) -> list[str]:
    return [rng.choice(sorted(OPS)) for _ in range(length)]


class RandomBlock(nn.Module):
    """pre-chain -> conv -> mid-chain -> scan (decay sigmoid(chain(a))) -> post-chain."""

    def __init__(self, seed: int):
        super().__init__()
        rng = random.Random(seed)
        self.pre, self.mid, self.decay, self.post = (
            _chain(rng, rng.randint(0, 3)) for _ in range(4)
        )
        k = rng.choice([1, 2, 3, 4])
        groups = rng.choice([1, C])
        causal = rng.random() < 0.5
        self.pad = (k - 1, 0) if causal else None
        self.conv = nn.Conv1d(C, C, k, groups=groups, padding=0 if causal else "same")
        self.ch = nn.Parameter(torch.randn(C, 1))
        self.time = nn.Parameter(torch.randn(N))
        self.row = nn.Parameter(torch.randn(1, 1, N))

    def _run(self, names, h, full):
        operands = {"ch": self.ch, "time": self.time, "row": self.row, "full": full}
        for name in names:
            h = OPS[name](h, operands)
        return h

    def forward(self, x, a, full, x0):
        h = self._run(self.pre, x, full)
        if self.pad is not None:
            h = F.pad(h, self.pad)
        h = self._run(self.mid, self.conv(h), full)
        decay = torch.sigmoid(self._run(self.decay, a, full))
        y = torch.ops.rustconv.linear_scan(x0, decay, h)
        return self._run(self.post, y, full)


#: Chains drawn by the default run (2-3 s each on the 2-core machine);
#: RUSTCONV_RANDOM_CHAINS=N draws N.
CHAINS = int(os.environ.get("RUSTCONV_RANDOM_CHAINS", "20"))


@pytest.mark.parametrize("seed", range(CHAINS))
def test_random_chain_is_one_call_and_matches_eager(seed):
    torch.manual_seed(seed)
    model = RandomBlock(seed).eval()
    shapes = [(1, C, N), (1, C, N), (1, C, N), (1, C)]
    example = structured_inputs(shapes, seed=seed)["random"]
    flow = "to_edge" if seed % 2 == 0 else "transform"
    edge = lower(model, tuple(example), flow)
    assert len(lowered_modules(edge)) == 1
    left = [t for t in top_level_targets(edge) if t not in ("executorch_call_delegate", "getitem")]
    assert left == [], (model.pre, model.mid, model.decay, model.post)
    for kind, inputs in structured_inputs(shapes, seed=seed + 100).items():
        (got,), _ = run_lowered(edge, inputs)
        want = model(*inputs)
        scale = max(1.0, want.abs().max().item())
        torch.testing.assert_close(
            got, want, atol=1e-4 * scale, rtol=0, msg=lambda m, kind=kind: f"{kind}: {m}"
        )
