"""Every conv1d configuration through the whole path: export, lower with
RustConvPartitioner, run in executorch.runtime and pte_runner, compare with
eager on random, all-ones and ramp inputs."""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_close,
    assert_delegated,
    input_sets,
    run_pte_runner,
    run_runtime,
    save,
)
from executorch.exir import to_edge
from rustconv import RustConvPartitioner
from torch.export import export


@dataclass(frozen=True)
class Conv:
    c_in: int
    c_out: int
    k: int
    n: int = 64
    groups: int = 1
    stride: int = 1
    dilation: int = 1
    padding: int = 0
    bias: bool = True
    batch: int = 1
    causal: bool = False  # F.pad(x, (K-1, 0)) before the conv

    def __str__(self):
        return "-".join(f"{k}{v}" for k, v in self.__dict__.items())


CONFIGS = [
    Conv(4, 6, 3),
    Conv(4, 6, 3, bias=False, batch=2),
    Conv(8, 8, 1),
    Conv(8, 8, 5, groups=8),  # depthwise
    Conv(8, 8, 4, groups=8, causal=True, bias=False),  # short causal conv
    Conv(6, 4, 3, groups=2),  # groups neither 1 nor C
    Conv(12, 8, 7, groups=4, batch=2),
    Conv(8, 16, 3, groups=8),  # depthwise multiplier 2
    Conv(4, 4, 3, stride=2),
    Conv(4, 4, 5, stride=3, padding=2),
    Conv(4, 4, 3, dilation=2, padding=2),
    Conv(4, 4, 5, dilation=3, stride=2, padding=4, bias=False),
    Conv(4, 4, 2, padding=3),
    Conv(3, 5, 16, n=100),
    Conv(16, 16, 32, n=256, groups=16, causal=True),
    Conv(8, 8, 128, n=512, groups=8, causal=True),
    Conv(4, 4, 64, n=64, groups=4, causal=True),  # K = N
    Conv(4, 4, 64, n=64, groups=4),  # K = N, single output
    Conv(4, 2, 9, n=8, padding=4),  # K > N
    Conv(2, 2, 3, n=4, stride=8, padding=1),  # stride > N
    Conv(8, 8, 1, n=32, stride=2, bias=False, batch=2),
]


class ConvModel(torch.nn.Module):
    def __init__(self, cfg: Conv):
        super().__init__()
        self.cfg = cfg
        self.conv = torch.nn.Conv1d(
            cfg.c_in, cfg.c_out, cfg.k, stride=cfg.stride, padding=cfg.padding,
            dilation=cfg.dilation, groups=cfg.groups, bias=cfg.bias,
        )  # fmt: skip

    def forward(self, x):
        if self.cfg.causal:
            x = F.pad(x, (self.cfg.k - 1, 0))
        return self.conv(x)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_conv1d_matches_eager(cfg, tmp_path):
    torch.manual_seed(hash(str(cfg)) % 1000)
    model = ConvModel(cfg).eval()
    shape = (cfg.batch, cfg.c_in, cfg.n)
    program = (
        to_edge(export(model, (torch.randn(shape),)))
        .to_backend(RustConvPartitioner())
        .to_executorch()
    )
    assert_delegated(program)
    pte = save(program, tmp_path)
    for kind, inputs in input_sets(shape).items():
        want = model(*inputs)
        assert_close(run_runtime(pte, inputs)[0], want, f"runtime, {kind}")
        assert_close(run_pte_runner(pte, inputs, tmp_path)[0], want, f"pte_runner, {kind}")


def test_functional_conv1d_with_input_weight(tmp_path):
    """F.conv1d whose weight is a graph input, not a parameter."""

    class M(torch.nn.Module):
        def forward(self, x, w):
            return F.conv1d(x, w, stride=2, padding=1, groups=2)

    x, w = torch.randn(2, 4, 33), torch.randn(6, 2, 3)
    program = to_edge(export(M(), (x, w))).to_backend(RustConvPartitioner()).to_executorch()
    assert_delegated(program)
    pte = save(program, tmp_path)
    assert_close(run_runtime(pte, (x, w))[0], M()(x, w))
    assert_close(run_pte_runner(pte, (x, w), tmp_path)[0], M()(x, w))


ALGORITHM_CASES = [
    ("direct", Conv(8, 8, 4, groups=8, causal=True, n=200)),
    ("direct", Conv(6, 4, 3, groups=2, stride=2, padding=1)),
    ("depthwise_simd", Conv(8, 8, 4, groups=8, causal=True, n=200)),
    ("depthwise_simd", Conv(16, 16, 3, groups=16, dilation=2, padding=2, batch=2)),
    ("fft", Conv(8, 8, 64, groups=8, causal=True, n=300)),
    ("fft", Conv(4, 4, 300, groups=4, causal=True, n=300, bias=False)),
    ("gemm", Conv(6, 4, 3, groups=2, stride=2, padding=1)),
    ("gemm", Conv(16, 32, 5, dilation=2, padding=3, batch=2)),
    ("fft_gemm", Conv(16, 24, 11, padding=5, batch=2, n=300)),
    ("fft_gemm", Conv(12, 8, 4, groups=4, dilation=3, causal=True, bias=False)),
]


@pytest.mark.parametrize("algorithm,cfg", ALGORITHM_CASES, ids=lambda c: str(c))
def test_each_algorithm_through_the_delegate(algorithm, cfg, tmp_path):
    """The conv1d_algorithm compile spec forces each kernel; the plan log line
    proves it ran, and the result still matches eager."""
    import subprocess

    import numpy as np
    from conftest import pte_runner_path
    from rustconv.compile_specs import algorithm as algorithm_spec

    torch.manual_seed(1)
    model = ConvModel(cfg).eval()
    shape = (cfg.batch, cfg.c_in, cfg.n)
    partitioner = RustConvPartitioner(compile_specs=[algorithm_spec(algorithm)])
    program = to_edge(export(model, (torch.randn(shape),))).to_backend(partitioner).to_executorch()
    assert_delegated(program)
    pte = save(program, tmp_path)
    x = torch.randn(shape)
    np.savez(tmp_path / "in.npz", **{"0": x.numpy()})
    run = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte), "-inputs_npz_path",
         str(tmp_path / "in.npz"), "-output_npz_path", str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert f"conv1d -> {algorithm} " in run.stderr, run.stderr
    # fft transforms the weights at init, and the blob is then freed; every
    # other algorithm reads them in place at every call.
    transformed = algorithm == "fft"
    assert ("the blob is released" in run.stderr) == transformed, run.stderr
    with np.load(tmp_path / "out.npz") as out:
        assert_close(out["0"], model(x), f"pte_runner, {algorithm}")
    assert_close(run_runtime(pte, (x,))[0], model(x), f"runtime, {algorithm}")
