"""transformers' FastConformer convolution module on the few frames a
subsampled encoder hands it (16 to 64): the calls whose prologue (GLU) and
epilogue (SiLU) the depthwise conv's short-row paths run. At 16 frames the
cost model picks the FFT on AVX-512, whose engine stages both through memory
below 64 samples (on AVX2, whose depthwise rate the model puts closer to the
FFT's, the depthwise kernel); at 32 and 64 the depthwise kernel takes whole
rows in blocks of channels. Each is one RustConv call, equal to eager in
executorch.runtime and in pte_runner, on the path the plan's instruction set
gives it (``rustconv.inspect``)."""

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


#: The depthwise conv's algorithm and fusion at 16 frames, per the
#: instruction set the plan logs ("plan: vector instructions ...").
SIXTEEN_FRAMES = {
    "avx512": ("fft", "staged through memory"),
    "avx2": ("depthwise_simd", "in its loops"),
}


@pytest.mark.parametrize(
    ("frames", "depthwise", "fusion"),
    [
        (16, None, None),
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
    if depthwise is None:
        (isa,) = [line.split()[-1] for line in plan["log"] if "vector instructions" in line]
        if isa not in SIXTEEN_FRAMES:
            pytest.skip(f"no expected path at 16 frames on {isa}")
        depthwise, fusion = SIXTEEN_FRAMES[isa]
    (kernel,) = [k for k in plan["kernels"] if k["algorithm"] not in ("gemm", "elementwise")]
    assert kernel["algorithm"] == depthwise, kernel
    assert fusion in kernel["fusion"], kernel
