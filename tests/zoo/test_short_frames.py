"""transformers' FastConformer convolution module on the few frames a
subsampled encoder hands it (16 to 64): the calls whose prologue (GLU) and
epilogue (SiLU) the depthwise conv's short-row paths run. At 16 frames the
cost model picks the FFT, whose engine stages both through memory below 64
samples; at 32 and 64 the depthwise kernel takes whole rows in blocks of
channels. Each is one RustConv call, equal to eager in executorch.runtime
and in pte_runner, on the path it is meant to test (``rustconv.inspect``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from zoo_harness import lower, run_in_pte_runner, run_in_runtime
from zoo_models import Example, _generator, randomize_norm_statistics


def conv_module(frames: int) -> Example:
    from transformers import ParakeetEncoderConfig
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoderConvolutionModule

    torch.manual_seed(0)
    model = ParakeetEncoderConvolutionModule(
        ParakeetEncoderConfig(hidden_size=128, conv_kernel_size=9)
    ).eval()
    randomize_norm_statistics(model, 2)
    x = torch.randn(1, frames, 128, generator=_generator(1))
    return Example(model, (x,), 1, "the whole module in one call")


@pytest.mark.parametrize(
    ("frames", "depthwise", "fusion"),
    [
        (16, "fft", "staged through memory"),
        (32, "depthwise_simd", "in its loops"),
        (64, "depthwise_simd", "in its loops"),
    ],
)
def test_short_frames_match_eager_on_their_path(frames, depthwise, fusion, tmp_path):
    low = lower(conv_module(frames), tmp_path)
    (program,) = low.programs
    assert (program.rustconv_calls, program.xnnpack_calls) == (1, 0)
    problems = run_in_runtime(low) + run_in_pte_runner(low, tmp_path)
    assert not problems, "\n".join(problems)
    plan = json.loads(
        subprocess.run(
            [sys.executable, "-m", "rustconv.inspect", str(program.pte), "--json"],
            capture_output=True, text=True, check=True,
        ).stdout
    )[0]["plan"]  # fmt: skip
    (kernel,) = [k for k in plan["kernels"] if k["algorithm"] not in ("gemm", "elementwise")]
    assert kernel["algorithm"] == depthwise, kernel
    assert fusion in kernel["fusion"], kernel
