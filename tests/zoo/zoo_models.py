"""The model zoo: upstream model code (transformers, torchaudio, ExecuTorch's
own examples as the executorch wheel ships them) built with random weights
and no downloads, each with what RustConv is expected to take from it.

Every entry builds at two sizes: ``full=False`` (the default test run: few
layers, narrow, short sequences) and ``full=True`` (the model's real widths,
fewer layers where it has many; ``RUSTCONV_ZOO_FULL=1`` in the tests, and the
benchmark's ``zoo`` workload). A built model is an :class:`Example`: the
module, the prefill call's inputs and, where the model streams, the decode
calls after it.

Expected RustConv calls are the goal, not today's count: one call per
chain of convs and the elementwise ops, views and norms between them that
the fused kernels take or are meant to take (issue 16: BatchNorm folded, GLU,
norms). ``outside`` lists the ops RustConv leaves to others, by edge op, and
why. ``known_failures`` marks checks that fail today for a reason another
helper owns; the tests turn them into ``xfail(strict=True)``.

The ExecuTorch LLM recipe (examples/models/lfm2 through examples/models/llama)
is in zoo_recipes.py: it lowers through LLMEdgeManager, not through the
generic path here.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Example:
    """One zoo model, built: ``module(*inputs)`` is the prefill call;
    ``steps`` the decode calls after it, in order (streaming models; state
    either in the module's buffers, carried by the program, or in the inputs
    themselves, already chained from eager's outputs)."""

    module: torch.nn.Module
    inputs: tuple
    rustconv_calls: int
    why: str
    steps: list[tuple] = field(default_factory=list)
    dynamic_shapes: object = None
    #: How the model's own export script exports and lowers it (ExecuTorch's
    #: examples): torch.export's strict mode, EdgeCompileConfig's arguments.
    strict: bool = False
    edge_compile_config: dict | None = None

    def eager_outputs(self) -> list[list[torch.Tensor]]:
        """Eager's outputs of every call, prefill first, on a copy of the
        module (its buffers start where the exported program's do)."""
        module = copy.deepcopy(self.module)
        outputs = []
        with torch.no_grad():
            for inputs in (self.inputs, *self.steps):
                outputs.append(flatten(module(*inputs)))
        return outputs


@dataclass(frozen=True)
class ZooModel:
    name: str
    source: str  # the upstream class and package
    build: Callable[[bool], Example]
    outside: dict[str, str]  # edge op RustConv leaves to others -> why
    known_failures: dict[str, str] = field(default_factory=dict)  # check -> reason
    slow: bool = False  # full-size only (too slow for the default run)


def flatten(out) -> list[torch.Tensor]:
    """A model's output as a flat list of tensors (HF ModelOutputs, tuples)."""
    if torch.is_tensor(out):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flatten(o)]
    raise TypeError(f"unexpected output {type(out).__name__}")


def delegate_calls(program, backend: str) -> int:
    """``DelegateCall`` instructions of a lowered program for that backend."""
    plan = program.executorch_program.execution_plan[0]
    ids = [d.id for d in plan.delegates]
    return sum(
        1
        for chain in plan.chains
        for instr in chain.instructions
        if type(instr.instr_args).__name__ == "DelegateCall"
        and ids[instr.instr_args.delegate_index] == backend
    )


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randomize_norm_statistics(module: torch.nn.Module, seed: int) -> None:
    """BatchNorm's running statistics and every norm's affine parameters off
    their identity defaults, so folding or fusing them is visible in the
    outputs (random init leaves mean 0, var 1, weight 1, bias 0)."""
    gen = _generator(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.5 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
            if isinstance(m, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm)):
                if m.weight is not None:
                    m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=gen))
                if m.bias is not None:
                    m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen))


class Logits(torch.nn.Module):
    """A transformers causal LM called the way an exported prefill is: token
    ids in, logits out, no cache."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


# transformers ------------------------------------------------------------------

#: LFM2-350M (LiquidAI/LFM2-350M's config.json): 10 short-conv layers (K = 3)
#: and 6 attention layers.
LFM2_350M_LAYERS = [
    "conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
    "full_attention", "conv", "full_attention", "conv", "full_attention", "conv",
    "full_attention", "conv",
]  # fmt: skip


def hf_lfm2(full: bool) -> Example:
    from transformers import Lfm2Config, Lfm2ForCausalLM

    if full:  # LFM2-350M, all 16 layers; the vocabulary too
        width, ffn, heads, kv, layers, vocab, n = 1024, 6656, 16, 8, LFM2_350M_LAYERS, 65536, 512
    else:
        layers = ["conv", "full_attention", "conv"]
        width, ffn, heads, kv, vocab, n = 256, 768, 4, 2, 256, 64
    torch.manual_seed(0)
    config = Lfm2Config(
        vocab_size=vocab, hidden_size=width, intermediate_size=ffn, num_hidden_layers=len(layers),
        num_attention_heads=heads, num_key_value_heads=kv, layer_types=layers,
        max_position_embeddings=4096, use_cache=False,
    )  # fmt: skip
    model = Logits(Lfm2ForCausalLM(config).eval())
    ids = torch.randint(0, vocab, (1, n), generator=_generator(1))
    convs = layers.count("conv")
    return Example(
        model, (ids,), convs,
        f"one per short-conv layer ({convs}): in_proj's chunks, B * x, the causal depthwise "
        "conv (K = 3) and C * y between the projections, which go to XNNPACK",
    )  # fmt: skip


def hf_lfm3(full: bool) -> Example:
    from transformers import Lfm3Config, Lfm3ForCausalLM

    layers = ["conv", "full_attention", "conv"]
    if full:  # LFM3's default widths, 3 of its 24 layers, a small vocabulary
        width, ffn, heads, kv, head_dim, vocab, n = 2048, 7680, 16, 4, 128, 4096, 512
    else:
        width, ffn, heads, kv, head_dim, vocab, n = 256, 512, 4, 2, 64, 256, 64
    torch.manual_seed(0)
    config = Lfm3Config(
        vocab_size=vocab, hidden_size=width, intermediate_size=ffn, num_hidden_layers=len(layers),
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, layer_types=layers,
        max_position_embeddings=4096, use_cache=False, pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    model = Logits(Lfm3ForCausalLM(config).eval())
    assert model.model.model.layers[0].conv.conv.kernel_size == (7,)
    ids = torch.randint(0, vocab, (1, n), generator=_generator(1))
    convs = layers.count("conv")
    return Example(
        model, (ids,), convs,
        f"one per short-conv layer ({convs}), as LFM2's, with K = 7",
    )  # fmt: skip


def hf_parakeet_encoder(full: bool) -> Example:
    from transformers import ParakeetEncoder, ParakeetEncoderConfig

    if full:  # parakeet-ctc-0.6b's widths, 2 of its 24 layers, 10 s of 10 ms frames
        width, layers, heads, ffn, frames = 1024, 2, 8, 4096, 1000
        sub = 256
    else:
        width, layers, heads, ffn, frames = 128, 2, 4, 256, 256
        sub = 32
    torch.manual_seed(0)
    config = ParakeetEncoderConfig(
        hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, conv_kernel_size=9, subsampling_conv_channels=sub,
        num_mel_bins=80, dropout=0.0, dropout_positions=0.0, layerdrop=0.0,
        activation_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = ParakeetEncoder(config).eval()
    randomize_norm_statistics(model, 2)
    features = torch.randn(1, frames, 80, generator=_generator(1))
    return Example(
        model, (features,), layers,
        f"one per conformer block ({layers}): its convolution module, pointwise conv, GLU, "
        "depthwise conv (K = 9) with its BatchNorm folded, SiLU, pointwise conv, and the "
        "transposes around it; the 2-D subsampling convs and attention are not RustConv's",
    )  # fmt: skip


def hf_parakeet_conv_module(full: bool) -> Example:
    """One FastConformer convolution module of ParakeetEncoder on its own
    ([B, T, C] in and out), the part of a conformer block that is RustConv's."""
    from transformers import ParakeetEncoderConfig
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoderConvolutionModule

    width, frames = (1024, 1000) if full else (128, 256)
    torch.manual_seed(0)
    config = ParakeetEncoderConfig(hidden_size=width, conv_kernel_size=9)
    model = ParakeetEncoderConvolutionModule(config).eval()
    randomize_norm_statistics(model, 2)
    x = torch.randn(1, frames, width, generator=_generator(1))
    return Example(
        model, (x,), 1,
        "one: the transposes, pointwise conv, GLU, depthwise conv (K = 9) with its BatchNorm "
        "folded, SiLU, pointwise conv",
    )  # fmt: skip


def ta_conformer_conv_module(full: bool) -> Example:
    """torchaudio's conformer convolution module (torchaudio.models.Conformer's):
    LayerNorm, pointwise conv, GLU, depthwise conv K = 31, BatchNorm, SiLU,
    pointwise conv, on [B, T, C]."""
    from torchaudio.models.conformer import _ConvolutionModule

    width, frames = (512, 1000) if full else (64, 200)
    torch.manual_seed(0)
    model = _ConvolutionModule(
        input_dim=width, num_channels=width, depthwise_kernel_size=31, bias=True
    ).eval()
    randomize_norm_statistics(model, 2)
    x = torch.randn(1, frames, width, generator=_generator(1))
    return Example(
        model, (x,), 1,
        "one: LayerNorm, pointwise conv, GLU, depthwise conv (K = 31) with its BatchNorm "
        "folded, SiLU, pointwise conv, and the transposes",
    )  # fmt: skip


def _mimi_config(full: bool):
    from transformers import MimiConfig

    if full:  # Mimi's SEANet as released: 64 filters, 512 channels, ratios 8 6 5 4
        return MimiConfig(num_filters=64, hidden_size=512)
    return MimiConfig(num_filters=8, hidden_size=32, upsample_groups=32)


def _padding_cache(convs, paddings: list[int]):
    """transformers' MimiConv1dPaddingCache for these MimiConv1d layers, as
    MimiEncoderModel.forward builds it when streaming, but with each layer's
    padding as an int read once at construction: its ``padding_total``
    buffer is a tensor, and slicing by a tensor makes every later length
    data-dependent (unexportable)."""
    from transformers.models.mimi.modeling_mimi import MimiConv1dPaddingCache

    return MimiConv1dPaddingCache(
        num_layers=len(convs),
        per_layer_padding=paddings,
        per_layer_padding_mode=[c.pad_mode for c in convs],
        per_layer_in_channels=[c.in_channels for c in convs],
    )


def _mimi_convs(seanet) -> list:
    from transformers.models.mimi.modeling_mimi import MimiConv1d

    convs = [m for m in seanet.modules() if isinstance(m, MimiConv1d)]
    for i, conv in enumerate(convs):  # the encoder numbers them so already
        assert conv.layer_idx in (None, i), (conv.layer_idx, i)
        conv.layer_idx = i
    return convs


class MimiSeanetEncoderStream(torch.nn.Module):
    """transformers' SEANet encoder (``MimiModel.encoder.encoder_seanet``)
    streaming through its own padding cache, the cache's states passed in and
    returned: ``(audio, *states) -> (latent, *new_states)``. With zero states
    and a length that is a multiple of the total stride, the prefill equals
    the offline encoder (causal zero padding); a hop of that many samples
    after it gives one latent frame (HF's streaming encode)."""

    def __init__(self, seanet):
        super().__init__()
        self.seanet = seanet
        self.convs = _mimi_convs(seanet)
        self.paddings = [int(c.padding_total) for c in self.convs]

    def forward(self, audio, *states):
        cache = _padding_cache(self.convs, self.paddings)
        cache.padding_cache = list(states)
        latent = self.seanet(audio, padding_cache=cache)
        return (latent, *cache.padding_cache)

    def zero_states(self) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.zeros(1, c.in_channels, p) for c, p in zip(self.convs, self.paddings, strict=True)
        )


class MimiSeanetDecoder(torch.nn.Module):
    """transformers' SEANet decoder (``MimiModel.decoder.decoder_seanet``):
    MimiDecoder.forward's loop over its layers, each causal conv given a
    fresh padding cache (zeros: the causal padding ``_pad1d`` would add;
    the decoder's convs have stride 1, so no extra right padding) instead of
    the tensor-valued ``_pad1d`` sizes export cannot make static. The
    decoder has no streaming mode upstream (its ConvTranspose1d layers)."""

    def __init__(self, seanet):
        super().__init__()
        self.seanet = seanet
        self.convs = _mimi_convs(seanet)
        self.paddings = [int(c.padding_total) for c in self.convs]

    def forward(self, latent):
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiResnetBlock

        cache = _padding_cache(self.convs, self.paddings)
        hidden_states = latent
        for layer in self.seanet.layers:
            if isinstance(layer, (MimiConv1d, MimiResnetBlock)):
                hidden_states = layer(hidden_states, padding_cache=cache)
            else:
                hidden_states = layer(hidden_states)
        return hidden_states


def hf_mimi_encoder(full: bool) -> Example:
    from transformers import MimiModel

    torch.manual_seed(0)
    config = _mimi_config(full)
    stream = MimiSeanetEncoderStream(MimiModel(config).eval().encoder.encoder_seanet).eval()
    hop = math.prod(config.upsampling_ratios)  # 960 samples: one latent frame
    frames, steps = (25, 3) if full else (10, 2)
    audio = torch.randn(1, 1, hop * (frames + steps), generator=_generator(1))
    calls, states = [], stream.zero_states()
    with torch.no_grad():
        for start, end in [(0, hop * frames)] + [
            (hop * (frames + k), hop * (frames + k + 1)) for k in range(steps)
        ]:
            calls.append((audio[:, :, start:end], *states))
            # The cache keeps views (slices of the last input): inputs of a
            # program are contiguous.
            states = [t.contiguous() for t in stream(*calls[-1])[1:]]
    return Example(
        stream, calls[0], 1,
        f"one: the whole SEANet encoder ({len(stream.convs)} convs, strided or not, the ELU "
        "before each, the cats of their padding states and the residual adds) is one chain",
        steps=calls[1:],
    )  # fmt: skip


def hf_mimi_decoder(full: bool) -> Example:
    from transformers import MimiModel

    torch.manual_seed(0)
    config = _mimi_config(full)
    decoder = MimiSeanetDecoder(MimiModel(config).eval().decoder.decoder_seanet).eval()
    frames = 25 if full else 10
    latent = torch.randn(1, config.hidden_size, frames, generator=_generator(1))
    return Example(
        decoder, (latent,), 1,
        "the whole SEANet decoder: its convs, ELUs and residual adds, and its "
        f"{len(config.upsampling_ratios)} ConvTranspose1d upsamplers (each a conv of its "
        "phases, interleaved)",
    )  # fmt: skip


def hf_speecht5_hifigan(full: bool) -> Example:
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    torch.manual_seed(0)
    if full:  # SpeechT5's vocoder as released (microsoft/speecht5_hifigan's config)
        config = SpeechT5HifiGanConfig()
    else:
        config = SpeechT5HifiGanConfig(
            model_in_dim=16, upsample_initial_channel=32, upsample_rates=[4, 4],
            upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3, 7],
            resblock_dilation_sizes=[[1, 3], [1, 3]],
        )  # fmt: skip
    model = SpeechT5HifiGan(config).eval()
    with torch.no_grad():  # its input normalization, off its identity default
        model.mean.copy_(0.5 * torch.randn(model.mean.shape, generator=_generator(3)))
        model.scale.copy_(0.5 + torch.rand(model.scale.shape, generator=_generator(4)))
    frames = 50 if full else 20
    spectrogram = torch.randn(frames, config.model_in_dim, generator=_generator(1))
    rates = config.upsample_rates
    return Example(
        model, (spectrogram,), 1,
        f"one: the whole vocoder (input normalization, {len(rates)} ConvTranspose1d "
        "upsamplers, each a conv of its phases interleaved, and the multi-receptive-field "
        "blocks: dilated convs, leaky ReLUs, residual adds and their average), up to tanh",
    )  # fmt: skip


def _gated_deltanet(full: bool):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    if full:  # Qwen3.5-0.8B's linear-attention widths: 6144 conv channels
        width, kh, vh, dim, n = 1024, 16, 16, 128, 512
    else:
        width, kh, vh, dim, n = 128, 2, 4, 32, 64
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        hidden_size=width, linear_num_key_heads=kh, linear_num_value_heads=vh,
        linear_key_head_dim=dim, linear_value_head_dim=dim, linear_conv_kernel_dim=4,
        num_hidden_layers=1, layer_types=["linear_attention"],
    )  # fmt: skip
    layer = Qwen3_5GatedDeltaNet(config, 0).eval()
    return layer, torch.randn(1, n, width, generator=_generator(1))


class GatedDeltaNetConv(torch.nn.Module):
    """The causal conv of transformers' Qwen3_5GatedDeltaNet, as its forward
    runs it in a prefill without cache: ``in_proj_qkv``, transpose, the
    module's own ``causal_conv1d_fn`` on ``conv1d.weight.squeeze(1)`` with
    SiLU, transpose back. (The whole layer's chunked delta rule unrolls into
    thousands of nodes: minutes to lower, so it is a full-size entry.)"""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn

        layer = self.layer
        mixed_qkv = layer.in_proj_qkv(hidden_states).transpose(1, 2)
        mixed_qkv = causal_conv1d_fn(
            mixed_qkv, layer.conv1d.weight.squeeze(1), layer.conv1d.bias,
            activation=layer.activation,
        )  # fmt: skip
        return mixed_qkv.transpose(1, 2)


class GatedDeltaNetLayer(torch.nn.Module):
    """transformers' Qwen3_5GatedDeltaNet called as in a prefill without cache."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        return self.layer(hidden_states)


def hf_qwen3_5_gated_deltanet_conv(full: bool) -> Example:
    layer, x = _gated_deltanet(full)
    return Example(
        GatedDeltaNetConv(layer), (x,), 1,
        "one: the causal depthwise conv (K = 4) over q, k and v's channels with its SiLU and "
        "the transposes around it; in_proj_qkv goes to XNNPACK",
    )  # fmt: skip


def hf_qwen3_5_gated_deltanet(full: bool) -> Example:
    layer, x = _gated_deltanet(full)
    return Example(
        GatedDeltaNetLayer(layer), (x,), 1,
        "one: the causal conv as in hf_qwen3_5_gated_deltanet_conv; the projections go to "
        "XNNPACK, the chunked gated delta rule is not a RustConv op",
    )  # fmt: skip


# torchaudio -----------------------------------------------------------------------


def _wav2letter(input_type: str, full: bool) -> Example:
    from torchaudio.models import Wav2Letter

    torch.manual_seed(0)
    if input_type == "waveform":
        model = Wav2Letter(num_classes=40, input_type="waveform", num_features=1).eval()
        x = torch.randn(1, 1, 80000 if full else 8000, generator=_generator(1))  # 5 s / 0.5 s
    else:
        model = Wav2Letter(num_classes=40, input_type="mfcc", num_features=13).eval()
        x = torch.randn(1, 13, 500 if full else 100, generator=_generator(1))
    convs = sum(isinstance(m, torch.nn.Conv1d) for m in model.modules())
    return Example(
        model, (x,), 1,
        f"one: all {convs} convs with the ReLU after each (strided, K up to 250, 1 to 2000 "
        "channels) chain into one call; log_softmax over the classes stays outside",
    )  # fmt: skip


def ta_wav2letter_waveform(full: bool) -> Example:
    return _wav2letter("waveform", full)


def ta_wav2letter_mfcc(full: bool) -> Example:
    return _wav2letter("mfcc", full)


# ExecuTorch's examples, as the wheel ships them -------------------------------------

#: The EdgeCompileConfig export_silero_vad.py and export_voxtral_rt.py lower with.
EXAMPLES_EDGE_CONFIG = {"_check_ir_validity": False, "_skip_dim_order": True}


def et_silero_vad(full: bool) -> Example:
    """SileroVAD16k (examples/models/silero_vad/export_silero_vad.py), exported
    as its script does: one 512-sample window with 64 samples of context per
    call, the LSTM state an input and an output; a stream is consecutive
    windows with the state chained."""
    from executorch.examples.models.silero_vad.export_silero_vad import (
        CONTEXT_SIZE,
        HIDDEN_DIM,
        INPUT_SIZE,
        SileroVAD16k,
    )

    torch.manual_seed(0)
    model = SileroVAD16k().eval()
    windows = 8 if full else 3
    audio = 0.3 * torch.randn(1, CONTEXT_SIZE + windows * (INPUT_SIZE - CONTEXT_SIZE),
                              generator=_generator(1))  # fmt: skip
    state = torch.zeros(2, 1, HIDDEN_DIM)
    calls = []
    with torch.no_grad():
        for w in range(windows):
            start = w * (INPUT_SIZE - CONTEXT_SIZE)
            x = audio[:, start : start + INPUT_SIZE]
            calls.append((x, state))
            _, state = model(x, state)
    return Example(
        model, calls[0], 2,
        "two: the learned STFT conv (1 -> 258 channels, K = 256, stride 128) with the "
        "slices of its real and imaginary halves, the magnitude (real ** 2 + imag ** 2, "
        "sqrt) and the four-conv encoder with its ReLUs; after the LSTM cell (XNNPACK's "
        "and portable ops), the final 1x1 conv with the ReLU before it and the sigmoid after",
        steps=calls[1:], edge_compile_config=EXAMPLES_EDGE_CONFIG,
    )  # fmt: skip


def _voxtral_config(full: bool):
    from executorch.examples.models.voxtral_realtime.model import VoxtralRealtimeConfig

    if full:  # Voxtral Realtime's encoder widths, one of its 32 layers, a small LM
        return VoxtralRealtimeConfig(
            dim=256, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=512,
            vocab_size=256, enc_n_layers=1,
        )  # fmt: skip
    return VoxtralRealtimeConfig(
        dim=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, hidden_dim=128, vocab_size=64,
        enc_dim=128, enc_n_layers=1, enc_n_heads=2, enc_head_dim=64, enc_hidden_dim=256,
    )  # fmt: skip


def et_voxtral_encoder(full: bool) -> Example:
    """voxtral_realtime's CausalWhisperEncoder (offline): its causal stem (two
    causal convs, K = 3, the second strided, GELU after each), then
    transformer layers."""
    from executorch.examples.models.voxtral_realtime.model import CausalWhisperEncoder

    config = _voxtral_config(full)
    torch.manual_seed(0)
    encoder = CausalWhisperEncoder(config, max_enc_len=1024).eval()
    mel = torch.randn(1, config.num_mel_bins, 800 if full else 64, generator=_generator(1))
    return Example(
        encoder, (mel,), 1,
        "one: the stem, causal pad, conv (128 mels -> enc_dim), GELU, causal pad, strided "
        "conv, GELU and the transpose to [B, T, C]; the layers after it go to XNNPACK",
        strict=True, edge_compile_config=EXAMPLES_EDGE_CONFIG,
    )  # fmt: skip


def et_voxtral_streaming_stem(full: bool) -> Example:
    """voxtral_realtime's StreamingAudioEncoderExport: 8 mel frames per call,
    the stem's conv states in buffers (cat, conv, copy_), as its export
    script lowers it for streaming."""
    from executorch.examples.models.voxtral_realtime.model import (
        StreamingAudioEncoderExport,
        VoxtralRealtimeModel,
    )

    config = _voxtral_config(full)
    torch.manual_seed(0)
    model = VoxtralRealtimeModel(config).eval()
    stream = StreamingAudioEncoderExport(model, max_enc_len=64).eval()
    chunks = 4 if full else 3
    mel = torch.randn(1, config.num_mel_bins, 8 * chunks, generator=_generator(1))
    calls = [
        (
            mel[:, :, 8 * c : 8 * c + 8].contiguous(),
            torch.arange(4 * c, 4 * c + 4, dtype=torch.long),
        )
        for c in range(chunks)
    ]
    return Example(
        stream, calls[0], 1,
        "one: the stem with its two conv states (cat state, conv, GELU, twice) kept by "
        "the delegate; the layers after it go to XNNPACK",
        steps=calls[1:], strict=True, edge_compile_config=EXAMPLES_EDGE_CONFIG,
    )  # fmt: skip


# The registry ------------------------------------------------------------------------

#: Why an op stays outside RustConv, for every op some zoo model leaves out
#: (explain()'s "is not a RustConv op", or "op: reason" at a conv).
WHY = {
    "aten.embedding.default": "the token embedding",
    "aten.mm.default": "projections and MLPs: XNNPACK's (mm after to_edge's decomposition)",
    "aten.addmm.default": "linears with a bias: XNNPACK's",
    "aten.bmm.default": "attention's matmuls: XNNPACK's",
    "aten._softmax.default": "attention's softmax",
    "aten._log_softmax.default": "log_softmax over the classes",
    "aten.arange.start_step": "positions, masks, a decomposed reflection pad",
    "aten.cumsum.default": "positions",
    "aten.index.Tensor": "positions, masks, a decomposed reflection pad",
    "aten.expand_copy.default": "masks",
    "aten.full.default": "masks, zero padding states",
    "aten.any.dim": "masks",
    "aten.bitwise_and.Tensor": "masks",
    "aten.logical_and.default": "masks",
    "aten.logical_not.default": "masks",
    "aten.remainder.Scalar": "ring-buffer positions",
    "aten._assert_scalar.default": "export's checks on data-dependent positions",
    "aten._local_scalar_dense.default": "a position read as a number (.item())",
    "ge": "a symbolic size check",
    "auto_functionalized_v2": "the KV cache's in-place update, functionalized",
    "llama.custom_sdpa.default": "ExecuTorch's custom SDPA",
    "dim_order_ops._empty_dim_order.default": "the padding cache's empty state of a conv "
    "with no padding (K = 1)",
    "aten.convolution.default: stride has 2 entries, expected 1 (1-D)": "the subsampling's "
    "Conv2d layers: not RustConv's",
    "aten.unsqueeze_copy.default: reshapes the result of <node>, which RustConv does not "
    "run; left with it for its backend": "the LSTM cell's output made 3-D for the final conv",
}


def outside(*ops: str) -> dict[str, str]:
    return {op: WHY[op] for op in ops}


#: What a transformers decoder leaves to others.
LLM_OPS = (
    "aten.embedding.default", "aten.mm.default", "aten.bmm.default", "aten._softmax.default",
    "aten.arange.start_step", "aten.cumsum.default", "aten.index.Tensor",
    "aten.expand_copy.default", "aten.full.default", "aten.any.dim", "aten.bitwise_and.Tensor",
    "aten.logical_not.default",
)  # fmt: skip

MODELS: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel(
            "hf_lfm2", "transformers Lfm2ForCausalLM", hf_lfm2, outside(*LLM_OPS),
        ),
        ZooModel(
            "hf_lfm3", "transformers Lfm3ForCausalLM (K = 7)", hf_lfm3, outside(*LLM_OPS),
        ),
        ZooModel(
            "hf_parakeet_encoder", "transformers ParakeetEncoder (FastConformer)",
            hf_parakeet_encoder,
            outside(
                "aten.mm.default", "aten.addmm.default", "aten.bmm.default",
                "aten._softmax.default",
                "aten.arange.start_step", "aten.expand_copy.default",
                "aten.any.dim", "aten.logical_not.default",
                "aten.convolution.default: stride has 2 entries, expected 1 (1-D)",
            ),
        ),
        ZooModel(
            "hf_mimi_encoder", "transformers MimiModel.encoder.encoder_seanet (SEANet)",
            hf_mimi_encoder,
            outside("dim_order_ops._empty_dim_order.default"),
        ),
        ZooModel(
            "hf_mimi_decoder", "transformers MimiModel.decoder.decoder_seanet (SEANet)",
            hf_mimi_decoder,
            outside("aten.full.default"),
        ),
        ZooModel(
            "hf_speecht5_hifigan", "transformers SpeechT5HifiGan (HiFi-GAN vocoder)",
            hf_speecht5_hifigan, outside(),
        ),
        ZooModel(
            "hf_qwen3_5_gated_deltanet_conv", "transformers Qwen3_5GatedDeltaNet's conv path",
            hf_qwen3_5_gated_deltanet_conv, outside("aten.mm.default"),
        ),
        ZooModel(
            "hf_qwen3_5_gated_deltanet", "transformers Qwen3_5GatedDeltaNet",
            hf_qwen3_5_gated_deltanet, outside(*LLM_OPS), slow=True,
        ),
        ZooModel(
            "hf_parakeet_conv_module", "transformers ParakeetEncoderConvolutionModule",
            hf_parakeet_conv_module, outside(),
        ),
        ZooModel(
            "ta_conformer_conv_module", "torchaudio conformer _ConvolutionModule (K = 31)",
            ta_conformer_conv_module, outside(),
        ),
        ZooModel(
            "ta_wav2letter_waveform", "torchaudio Wav2Letter(input_type='waveform')",
            ta_wav2letter_waveform, outside("aten._log_softmax.default"),
        ),
        ZooModel(
            "ta_wav2letter_mfcc", "torchaudio Wav2Letter(input_type='mfcc')",
            ta_wav2letter_mfcc, outside("aten._log_softmax.default"),
        ),
        ZooModel(
            "et_silero_vad", "executorch examples/models/silero_vad SileroVAD16k",
            et_silero_vad,
            outside(
                "aten.arange.start_step", "aten.index.Tensor", "aten.addmm.default",
                "aten.unsqueeze_copy.default: reshapes the result of <node>, which RustConv "
                "does not run; left with it for its backend",
            ),
        ),
        ZooModel(
            "et_voxtral_encoder", "executorch examples/models/voxtral_realtime "
            "CausalWhisperEncoder", et_voxtral_encoder,
            outside(
                "aten.mm.default", "aten.addmm.default", "aten.bmm.default",
                "aten._softmax.default", "aten.arange.start_step", "aten.expand_copy.default",
                "aten.full.default",
                "aten.any.dim", "aten.logical_and.default", "aten.logical_not.default",
            ),
        ),
        ZooModel(
            "et_voxtral_streaming_stem", "executorch examples/models/voxtral_realtime "
            "StreamingAudioEncoderExport", et_voxtral_streaming_stem,
            outside(
                "aten.mm.default", "aten.addmm.default",
                "aten.arange.start_step", "aten.full.default", "aten.bitwise_and.Tensor",
                "aten.remainder.Scalar", "aten._assert_scalar.default",
                "aten._local_scalar_dense.default", "ge", "auto_functionalized_v2",
                "llama.custom_sdpa.default",
            ),
        ),
    ]
}  # fmt: skip


def geometric_scale(t: torch.Tensor) -> float:
    """An output's scale: its largest magnitude (1 for an all-zero output)."""
    return float(t.abs().max()) if t.numel() and float(t.abs().max()) > 0 else 1.0


def tolerance(t: torch.Tensor) -> float:
    """1e-4 times the output's scale: the zoo's accuracy bar."""
    return 1e-4 * geometric_scale(t)


__all__ = ["MODELS", "Example", "ZooModel", "flatten", "tolerance"]
