"""Normalisations inside the fused kernels, end to end on upstream modules
(random weights, no downloads): transformers' wav2vec2 feature encoder
(the issue's speech front-end: 1 -> 512 channels K=10 stride 5, then
512 -> 512 K=3 and K=2 stride 2, a LayerNorm over the channels or a
GroupNorm(512, 512) and GELU between) and ParakeetEncoder's LayerNorm
before its conformer convolution, a conv -> LayerNorm -> GELU -> conv chain
in float32 and float16, and transformers' Lfm2RMSNorm before a short conv.
Each is checked to be the expected number of RustConv calls with no norm
left outside (``explain()``, the program's operators), run through
executorch.runtime and pte_runner, and compared with eager at 1e-4 times
the output's scale."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, delegate_backends, run_pte_runner, run_runtime, save
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from rustconv.devtools.inspect import delegate_calls, plan_blob
from torch import nn
from torch.export import Dim, export

NORM_OPS = ("layer_norm", "group_norm", "mean", "var", "rsqrt", "pow", "gelu")


def _lower(model, example, dynamic_shapes=None, explain=True):
    """``(program, explain())``: RustConv first, XNNPACK for the rest, as users lower."""
    ep = export(model, example, dynamic_shapes=dynamic_shapes, strict=False)
    explained = None
    if explain:
        edge = to_edge(copy.deepcopy(ep)).exported_program()
        explained = RustConvPartitioner().explain(edge)
    edge = to_edge_transform_and_lower(
        ep, partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
    )
    return edge.to_executorch(), explained


def _outside_ops(program) -> list[str]:
    """Operators the program runs outside any delegate."""
    return [op.name for op in program.executorch_program.execution_plan[0].operators]


def _check(program, example, want, tmp_path, pte_runner=True):
    pte = save(program, tmp_path)
    scale = max(1.0, want.abs().max().item())
    got = run_runtime(pte, example)[0]
    assert_close(got.float(), want.float(), "executorch.runtime", 1e-4 * scale)
    if pte_runner:
        got = run_pte_runner(pte, example, tmp_path)[0]
        assert_close(got, want, "pte_runner", 1e-4 * scale)


def _kernels(program):
    return [k for call in delegate_calls(program.buffer)
            for k in plan_blob(call.blob, call.compile_specs)["kernels"]]  # fmt: skip


def _wav2vec2(norm: str):
    from transformers import Wav2Vec2Config
    from transformers.models.wav2vec2.modeling_wav2vec2 import Wav2Vec2FeatureEncoder

    config = Wav2Vec2Config(
        feat_extract_norm=norm,
        conv_dim=(512, 512, 512),
        conv_kernel=(10, 3, 2),
        conv_stride=(5, 2, 2),
        conv_bias=norm == "layer",
    )
    torch.manual_seed(0)
    return Wav2Vec2FeatureEncoder(config).eval()


@pytest.mark.parametrize("norm", ["layer", "group"])
def test_wav2vec2_feature_encoder_is_one_call(norm, tmp_path):
    """Every conv, norm and GELU of the front-end in one RustConv call: each
    norm and GELU in the next conv's prologue (the last in a pass), after
    that kernel's statistics pass; nothing left to portable kernels."""
    model = _wav2vec2(norm)
    example = (torch.randn(1, 4000, generator=torch.Generator().manual_seed(1)),)
    program, explained = _lower(model, example)
    assert delegate_backends(program) == ["RustConvBackend"], delegate_backends(program)
    assert _outside_ops(program) == [], _outside_ops(program)
    assert not [n for n in explained if any(op in n for op in NORM_OPS)], explained
    kernels = _kernels(program)
    with_statistics = [k for k in kernels if "statistics first: mean and var" in k["fusion"]]
    # layer: the three LayerNorms; group: the first layer's GroupNorm alone.
    assert len(with_statistics) == (3 if norm == "layer" else 1), kernels
    with torch.no_grad():
        want = model(*example)
    _check(program, example, want, tmp_path)


def test_wav2vec2_layer_norm_stack_follows_a_dynamic_length(tmp_path):
    model = _wav2vec2("layer")
    example = (torch.randn(1, 4000),)
    dynamic = {"input_values": {1: Dim("samples", min=400, max=8000)}}
    program, _ = _lower(model, example, dynamic, explain=False)
    assert delegate_backends(program) == ["RustConvBackend"]
    pte = save(program, tmp_path)
    for samples in (400, 2345, 8000):
        x = torch.randn(1, samples)
        with torch.no_grad():
            want = model(x)
        got = run_runtime(pte, (x,))[0]
        assert_close(got, want, f"{samples} samples", 1e-4 * want.abs().max().item())


class ConvNormConv(nn.Module):
    """conv -> LayerNorm over the channels -> GELU -> conv, wav2vec2's way."""

    def __init__(self, channels=256):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, channels, 3, padding=1)
        self.norm = nn.LayerNorm(channels)
        self.conv2 = nn.Conv1d(channels, channels, 3, padding=1)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = self.conv1(x)
        y = self.norm(y.transpose(-2, -1)).transpose(-2, -1)
        return self.conv2(F.gelu(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv_layer_norm_gelu_conv_is_one_call(dtype, tmp_path):
    torch.manual_seed(0)
    model = ConvNormConv().eval()
    x = torch.randn(1, 256, 300)
    example = (x.to(dtype),)
    program, explained = _lower(copy.deepcopy(model).to(dtype), example)
    assert delegate_backends(program) == ["RustConvBackend"]
    assert _outside_ops(program) == []
    assert explained == {}, explained
    kernels = _kernels(program)
    assert len(kernels) == 2, kernels
    assert kernels[1]["fusion"].startswith("statistics first: mean and var over dim 2"), kernels
    ops = [op["op"] for op in kernels[1]["absorbed"]]
    assert {"mean", "var", "rsqrt", "gelu", "conv1d"} <= set(ops), ops
    with torch.no_grad():
        want = model(x)
    if dtype == torch.float32:
        _check(program, example, want, tmp_path)
    else:
        # Statistics and everything between the convs in float32: the result
        # is float32 eager's up to the float16 rounding of weights and I/O.
        got = run_runtime(save(program, tmp_path), example)[0]
        assert got.dtype == torch.float16
        assert_close(got.float(), want, "float16", 2e-2 * want.abs().max().item())


class RmsNormShortConv(nn.Module):
    """transformers' Lfm2RMSNorm right before a causal depthwise short conv
    over a ``[B, N, D]`` sequence (read through a transpose)."""

    def __init__(self, dim=128, kernel=3):
        super().__init__()
        from transformers.models.lfm2.modeling_lfm2 import Lfm2RMSNorm

        self.norm = Lfm2RMSNorm(dim, eps=1e-5)
        self.conv = nn.Conv1d(dim, dim, kernel, groups=dim, padding=kernel - 1, bias=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        n = x.shape[1]
        y = self.conv(self.norm(x).transpose(-1, -2))[..., :n]
        return y.transpose(-1, -2)


def test_lfm2_rms_norm_before_a_short_conv_is_its_prologue(tmp_path):
    torch.manual_seed(0)
    model = RmsNormShortConv().eval()
    example = (torch.randn(1, 200, 128),)
    program, explained = _lower(model, example)
    assert delegate_backends(program) == ["RustConvBackend"]
    assert explained == {}, explained
    (kernel,) = _kernels(program)
    assert kernel["fusion"].startswith("statistics first: mean over dim 2"), kernel
    assert "prologue in its loops" in kernel["fusion"], kernel
    with torch.no_grad():
        want = model(*example)
    _check(program, example, want, tmp_path)


def test_parakeet_layer_norm_joins_its_conformer_convolution(tmp_path):
    """ParakeetEncoder's LayerNorm before each conformer convolution module
    is the statistics pass and prologue of the module's first pointwise
    conv; the model still equals eager."""
    from transformers import ParakeetEncoder, ParakeetEncoderConfig

    config = ParakeetEncoderConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=128,
        conv_kernel_size=9,
        subsampling_conv_channels=32,
        num_mel_bins=80,
    )
    torch.manual_seed(0)
    model = ParakeetEncoder(config).eval()
    example = (torch.randn(1, 200, 80),)
    # RustConv alone (XNNPACK's lowering of the attention takes 40 s here).
    ep = export(model, example, strict=False)
    program = to_edge(ep).to_backend(RustConvPartitioner()).to_executorch()
    kernels = _kernels(program)
    pointwise = [
        k
        for k in kernels
        if k["fusion"].startswith("statistics first: mean and var over dim 2")
        and any(op["op"] == "conv1d" for op in k["absorbed"])
    ]
    assert len(pointwise) == 1, kernels
    with torch.no_grad():
        want = model(*example).last_hidden_state
    _check(program, example, want, tmp_path, pte_runner=False)
