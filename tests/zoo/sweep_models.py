"""The sweep's catalogue: upstream models with a 1-D convolution beyond the
zoo (zoo_models.py), built from tiny random configurations (hidden 64, one
or two layers, short inputs) with no downloads.

The zoo states, for each of its models, how many calls RustConv should
make and what it should leave outside, and checks them in the default test
run. The sweep (sweep.py) asks less of many more models: does each export,
lower with ``[RustConvPartitioner(), XnnpackPartitioner()]``, run, and
match eager? Its counts are observed, not expected (``Example.rustconv_calls``
is 0 and ``why`` says so). A model whose export fails before any partitioner
runs stays in the catalogue: the sweep reports it as upstream's, and the
day upstream exports it the sweep starts checking it.

Causal LMs (hybrids with Mamba or short-conv layers among them) are called
with ``use_cache=False`` and return logits, as an exported prefill does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from zoo_models import Example, Logits, randomize_norm_statistics

COUNTED = "counted by the sweep, not stated"


@dataclass(frozen=True)
class SweepModel:
    name: str
    source: str  # the upstream class and package
    build: Callable[[], Example]


class Pick(torch.nn.Module):
    """Calls an upstream module with fixed keyword arguments and returns one
    field of its output (a ModelOutput's attribute or a tuple's index)."""

    def __init__(self, model: torch.nn.Module, field: str | int | None = None, **kwargs):
        super().__init__()
        self.model = model
        self.field = field
        self.kwargs = kwargs

    def forward(self, *inputs):
        out = self.model(*inputs, **self.kwargs)
        if self.field is None:
            return out
        if isinstance(self.field, int):
            return out[self.field]
        return getattr(out, self.field)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def audio(samples: int = 4000, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, samples, generator=_generator(seed))


def features(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=_generator(seed))


def tokens(vocab: int = 128, n: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=_generator(seed))


def hf(config: str, model: str, **kwargs) -> torch.nn.Module:
    """transformers' ``model`` class built from ``config(**kwargs)``, seeded,
    in eval mode, with its norms' statistics and affine parameters random."""
    import transformers

    torch.manual_seed(0)
    built = getattr(transformers, model)(getattr(transformers, config)(**kwargs)).eval()
    randomize_norm_statistics(built, 2)
    return built


def example(module: torch.nn.Module, *inputs: torch.Tensor) -> Example:
    return Example(module.eval(), tuple(inputs), 0, COUNTED)


def lm(config: str, model: str, vocab: int = 128, n: int = 40, **kwargs) -> Example:
    """A causal LM: token ids in, logits out, no cache. The prompt is 40 tokens:
    transformers' LFM2 short conv was wrong from 32 up (issue 16), so a prefill
    must reach past the lengths where a kernel picks another path."""
    kwargs = {"vocab_size": vocab, "use_cache": False, **kwargs}
    return example(Logits(hf(config, model, **kwargs)), tokens(vocab, n))


#: Common small LM widths (transformers' names).
LM = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip

#: wav2vec2-family widths: a three-layer feature extractor (stride 20).
W2V = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
    num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
)  # fmt: skip


def hidden(config: str, model: str, **kwargs) -> Callable[[], Example]:
    """An audio encoder on a waveform: last_hidden_state."""
    return lambda: example(Pick(hf(config, model, **kwargs), "last_hidden_state"), audio())


# transformers: speech encoders ---------------------------------------------------------


def whisper_encoder() -> Example:
    model = hf(
        "WhisperConfig", "WhisperModel", d_model=64, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=50,
    )  # fmt: skip
    return example(Pick(model.encoder, "last_hidden_state"), features(1, 16, 100))


def moonshine_encoder() -> Example:
    model = hf(
        "MoonshineConfig", "MoonshineModel", vocab_size=100, hidden_size=64,
        intermediate_size=128, encoder_num_hidden_layers=1, decoder_num_hidden_layers=1,
        encoder_num_attention_heads=4, decoder_num_attention_heads=4,
    )  # fmt: skip
    return example(Pick(model.encoder, "last_hidden_state"), audio())


def speech2text_encoder() -> Example:
    model = hf(
        "Speech2TextConfig", "Speech2TextModel", vocab_size=100, d_model=64, encoder_layers=2,
        decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, conv_channels=64, input_feat_per_channel=16,
        max_source_positions=100, max_target_positions=50,
    )  # fmt: skip
    return example(Pick(model.encoder, "last_hidden_state"), features(1, 80, 16))


def qwen2_audio_encoder() -> Example:
    # It checks the input is exactly 2 x max_source_positions frames long.
    model = hf(
        "Qwen2AudioEncoderConfig", "Qwen2AudioEncoder", num_mel_bins=16, encoder_layers=2,
        encoder_attention_heads=4, encoder_ffn_dim=128, d_model=64, max_source_positions=50,
    )  # fmt: skip
    return example(Pick(model, "last_hidden_state"), features(1, 16, 100))


def seamless_m4t_v2_speech_encoder() -> Example:
    from transformers import SeamlessM4Tv2Config
    from transformers.models.seamless_m4t_v2.modeling_seamless_m4t_v2 import (
        SeamlessM4Tv2SpeechEncoder,
    )

    torch.manual_seed(0)
    config = SeamlessM4Tv2Config(
        hidden_size=64, speech_encoder_layers=2, speech_encoder_attention_heads=4,
        speech_encoder_intermediate_size=128, feature_projection_input_dim=32,
        conv_depthwise_kernel_size=7, adaptor_kernel_size=4, adaptor_stride=4,
        num_adapter_layers=1, left_max_position_embeddings=16, right_max_position_embeddings=4,
        speech_encoder_layerdrop=0.0, dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = SeamlessM4Tv2SpeechEncoder(config).eval()
    randomize_norm_statistics(model, 2)
    return example(Pick(model, "last_hidden_state"), features(1, 40, 32))


def wav2vec2_bert() -> Example:
    model = hf(
        "Wav2Vec2BertConfig", "Wav2Vec2BertModel", hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, feature_projection_input_dim=32,
        conv_depthwise_kernel_size=7, add_adapter=False, position_embeddings_type="relative_key",
        left_max_position_embeddings=16, right_max_position_embeddings=4,
    )  # fmt: skip
    return example(Pick(model, "last_hidden_state"), features(1, 40, 32))


def gemma3n_audio_encoder() -> Example:
    model = hf(
        "Gemma3nAudioConfig", "Gemma3nAudioEncoder", input_feat_size=32, hidden_size=64,
        conf_num_attention_heads=4, conf_num_hidden_layers=2, conf_conv_kernel_size=5,
        sscp_conv_channel_size=[16, 16],
    )  # fmt: skip
    mel = features(1, 64, 32)
    mask = torch.zeros(1, 64, dtype=torch.bool)  # True marks padding: none
    return example(Pick(model, 0), mel, mask)


def phi4_multimodal_audio() -> Example:
    model = hf(
        "Phi4MultimodalAudioConfig", "Phi4MultimodalAudioModel", hidden_size=64,
        intermediate_size=128, num_blocks=2, num_attention_heads=4, ext_pw_out_channel=64,
        depthwise_separable_out_channel=64, nemo_conv_channels=32, input_size=16,
        time_reduction=8, kernel_size=3,
    )  # fmt: skip
    return example(Pick(model, mask=None), features(1, 64, 16))


# transformers: vocoders ----------------------------------------------------------------


def speecht5_hifigan() -> Example:
    model = hf(
        "SpeechT5HifiGanConfig", "SpeechT5HifiGan", model_in_dim=16,
        upsample_initial_channel=32, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3, 7], resblock_dilation_sizes=[[1, 3], [1, 3]],
    )  # fmt: skip
    return example(model, features(20, 16))


def fastspeech2_conformer_hifigan() -> Example:
    model = hf(
        "FastSpeech2ConformerHifiGanConfig", "FastSpeech2ConformerHifiGan", model_in_dim=16,
        upsample_initial_channel=32, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3, 7], resblock_dilation_sizes=[[1, 3], [1, 3]],
    )  # fmt: skip
    return example(model, features(1, 20, 16))


def univnet() -> Example:
    # The kernel predictor's residual blocks are model_in_channels wide while
    # its input conv gives kernel_predictor_hidden_channels: upstream's configs
    # keep the two equal (64), and so must this one.
    model = hf(
        "UnivNetConfig", "UnivNetModel", model_in_channels=16, model_hidden_channels=8,
        num_mel_bins=16, resblock_kernel_sizes=[3, 3], resblock_stride_sizes=[4, 4],
        resblock_dilation_sizes=[[1, 3], [1, 3]], kernel_predictor_num_blocks=1,
        kernel_predictor_hidden_channels=16,
    )  # fmt: skip
    # The noise is one frame per spectrogram frame ([B, T, model_in_channels]).
    return example(
        Pick(model, 0, return_dict=False), features(1, 10, 16), features(1, 10, 16, seed=2)
    )


def dac_encoder() -> Example:
    model = hf(
        "DacConfig", "DacModel", encoder_hidden_size=8, downsampling_ratios=[2, 4],
        decoder_hidden_size=32, n_codebooks=2, codebook_size=64, codebook_dim=4, hidden_size=64,
    )  # fmt: skip
    return example(model.encoder, audio(1024).unsqueeze(1))


def encodec_encoder() -> Example:
    model = hf(
        "EncodecConfig", "EncodecModel", num_filters=8, upsampling_ratios=[4, 2],
        hidden_size=32, num_lstm_layers=1, codebook_size=64,
    )  # fmt: skip
    return example(model.encoder, audio(1024).unsqueeze(1))


def fastspeech2_conformer() -> Example:
    model = hf(
        "FastSpeech2ConformerConfig", "FastSpeech2ConformerModel", vocab_size=50,
        hidden_size=64, encoder_layers=1, decoder_layers=1, encoder_num_attention_heads=2,
        decoder_num_attention_heads=2, encoder_linear_units=64, decoder_linear_units=64,
        num_mel_bins=16, speech_decoder_postnet_layers=2, speech_decoder_postnet_units=32,
        duration_predictor_layers=1, duration_predictor_channels=32, energy_predictor_layers=1,
        energy_predictor_channels=32, pitch_predictor_layers=1, pitch_predictor_channels=32,
        encoder_kernel_size=5, decoder_kernel_size=5,
    )  # fmt: skip
    return example(Pick(model, 0, return_dict=False), tokens(50, 10))


def vits() -> Example:
    # No noise, so eager is deterministic; durations still depend on the data.
    model = hf(
        "VitsConfig", "VitsModel", vocab_size=38, hidden_size=64, num_hidden_layers=1,
        num_attention_heads=2, ffn_dim=128, flow_size=32, spectrogram_bins=33,
        upsample_initial_channel=32, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
        duration_predictor_filter_channels=32, prior_encoder_num_wavenet_layers=1,
        posterior_encoder_num_wavenet_layers=1, depth_separable_num_layers=1,
        duration_predictor_num_flows=1, prior_encoder_num_flows=1, noise_scale=0.0,
        noise_scale_duration=0.0,
    )  # fmt: skip
    return example(Pick(model, "waveform"), tokens(38, 10))


# transformers: text encoders ------------------------------------------------------------


def convbert() -> Example:
    model = hf(
        "ConvBertConfig", "ConvBertModel", vocab_size=128, hidden_size=64, embedding_size=64,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_kernel_size=9,
        max_position_embeddings=64,
    )  # fmt: skip
    return example(Pick(model, "last_hidden_state"), tokens(128, 16))


def squeezebert() -> Example:
    model = hf(
        "SqueezeBertConfig", "SqueezeBertModel", vocab_size=128, hidden_size=64,
        embedding_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64,
    )  # fmt: skip
    return example(Pick(model, "last_hidden_state"), tokens(128, 16))


# transformers: causal LMs with convs (state-space and hybrid) --------------------------

MAMBA2_HEADS = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
                    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8)  # fmt: skip


def mamba() -> Example:
    return lm(
        "MambaConfig", "MambaForCausalLM", hidden_size=64, state_size=8, num_hidden_layers=2,
        expand=2, conv_kernel=4,
    )  # fmt: skip


def mamba2() -> Example:
    return lm(
        "Mamba2Config", "Mamba2ForCausalLM", hidden_size=64, state_size=16, num_hidden_layers=2,
        expand=2, conv_kernel=4, num_heads=8, head_dim=16, n_groups=1, chunk_size=8,
    )  # fmt: skip


def falcon_mamba() -> Example:
    return lm(
        "FalconMambaConfig", "FalconMambaForCausalLM", hidden_size=64, state_size=8,
        num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=8,
        intermediate_size=128,
    )  # fmt: skip


def bamba() -> Example:
    return lm("BambaConfig", "BambaForCausalLM", attn_layer_indices=[1], **LM, **MAMBA2_HEADS)


def granite_moe_hybrid() -> Example:
    return lm(
        "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
        layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=64, **LM, **MAMBA2_HEADS,
    )  # fmt: skip


def granite_hybrid_dense() -> Example:
    """Granite 4.0's dense hybrids (granite-4.0-h-micro): no experts, only the
    shared MLP, so no MoE routing (whose histc does not export)."""
    return lm(
        "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
        layer_types=["mamba", "attention"], num_local_experts=0, shared_intermediate_size=64,
        **LM, **MAMBA2_HEADS,
    )  # fmt: skip


def falcon_h1() -> Example:
    return lm(
        "FalconH1Config", "FalconH1ForCausalLM", mamba_d_ssm=128,
        **LM, **MAMBA2_HEADS,
    )  # fmt: skip


def jamba(experts: bool = True) -> Example:
    """With ``experts=False`` no layer is a mixture of experts (their
    routing's histc does not export), so the Mamba layer is checked."""
    return lm(
        "JambaConfig", "JambaForCausalLM", attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2 if experts else 4, expert_layer_offset=1 if experts else 3,
        num_experts=2, num_experts_per_tok=1, use_mamba_kernels=False, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, **LM,
    )  # fmt: skip


def zamba2() -> Example:
    return lm(
        "Zamba2Config", "Zamba2ForCausalLM", hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, layers_block_type=["mamba", "hybrid"], hybrid_layer_ids=[1],
        num_attention_heads=4, num_key_value_heads=4, attention_head_dim=32,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=8,
        mamba_headdim=16, chunk_size=8, use_mamba_kernels=False, max_position_embeddings=256,
    )  # fmt: skip


def nemotron_h() -> Example:
    return lm(
        "NemotronHConfig", "NemotronHForCausalLM", hidden_size=64,
        layers_block_type=["mamba", "attention", "mlp"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, ssm_state_size=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=1, conv_kernel=4, expand=2, chunk_size=8,
        use_mamba_kernels=False, max_position_embeddings=256,
    )  # fmt: skip


LINEAR_ATTENTION = dict(
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, head_dim=16,
    layer_types=["linear_attention", "full_attention"],
)  # fmt: skip


def qwen3_next(experts: bool = True) -> Example:
    """With ``experts=False`` every layer's MLP is dense (``mlp_only_layers``)."""
    return lm(
        "Qwen3NextConfig", "Qwen3NextForCausalLM", moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        mlp_only_layers=[] if experts else [0, 1], **LM, **LINEAR_ATTENTION,
    )  # fmt: skip


def qwen3_5_text() -> Example:
    return lm("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", **LM, **LINEAR_ATTENTION)


def lfm2_moe() -> Example:
    return lm(
        "Lfm2MoeConfig", "Lfm2MoeForCausalLM", moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, num_dense_layers=1, layer_types=["conv", "full_attention"],
        **LM,
    )  # fmt: skip


def recurrent_gemma() -> Example:
    return lm(
        "RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, lru_width=64, attention_window_size=16,
        conv1d_width=4, block_types=["recurrent", "attention"],
    )  # fmt: skip


# torchaudio ------------------------------------------------------------------------------

#: W2V's feature extractor in torchaudio's terms: (channels, kernel, stride).
EXTRACTOR = [(32, 10, 5), (32, 3, 2), (32, 3, 2)]


def _ta_wav2vec2(extractor: str, bias: bool, norm_first: bool) -> Example:
    """torchaudio's wav2vec2_model with one of its pretrained builders'
    architectures (wav2vec2_base / hubert_base: group norm, no conv bias,
    post-norm; wav2vec2_large_lv60k / hubert_large: layer norm, conv bias,
    pre-norm) at tiny widths (the builders take no sizes)."""
    from torchaudio.models import wav2vec2_model

    torch.manual_seed(0)
    model = wav2vec2_model(
        extractor_mode=extractor, extractor_conv_layer_config=EXTRACTOR,
        extractor_conv_bias=bias, encoder_embed_dim=64, encoder_projection_dropout=0.0,
        encoder_pos_conv_kernel=16, encoder_pos_conv_groups=4, encoder_num_layers=2,
        encoder_num_heads=4, encoder_attention_dropout=0.0, encoder_ff_interm_features=128,
        encoder_ff_interm_dropout=0.0, encoder_dropout=0.0, encoder_layer_norm_first=norm_first,
        encoder_layer_drop=0.0, aux_num_out=None,
    )  # fmt: skip
    randomize_norm_statistics(model, 2)
    return example(Pick(model, 0), audio())


def ta_wavlm() -> Example:
    from torchaudio.models import wavlm_model

    torch.manual_seed(0)
    model = wavlm_model(
        extractor_mode="group_norm", extractor_conv_layer_config=EXTRACTOR,
        extractor_conv_bias=False, encoder_embed_dim=64, encoder_projection_dropout=0.0,
        encoder_pos_conv_kernel=16, encoder_pos_conv_groups=4, encoder_num_layers=2,
        encoder_num_heads=4, encoder_num_buckets=32, encoder_max_distance=100,
        encoder_attention_dropout=0.0, encoder_ff_interm_features=128,
        encoder_ff_interm_dropout=0.0, encoder_dropout=0.0, encoder_layer_norm_first=False,
        encoder_layer_drop=0.0, aux_num_out=None,
    )  # fmt: skip
    return example(Pick(model, 0), audio())


def ta_conv_tasnet() -> Example:
    from torchaudio.models import ConvTasNet

    torch.manual_seed(0)
    model = ConvTasNet(
        num_sources=2, enc_kernel_size=16, enc_num_feats=32, msk_kernel_size=3, msk_num_feats=16,
        msk_num_hidden_feats=32, msk_num_layers=2, msk_num_stacks=1,
    )  # fmt: skip
    return example(model, audio(800).unsqueeze(1))


def ta_tacotron2_postnet() -> Example:
    from torchaudio.models.tacotron2 import _Postnet

    torch.manual_seed(0)
    model = _Postnet(n_mels=16, postnet_embedding_dim=32, postnet_kernel_size=5,
                     postnet_n_convolution=3)  # fmt: skip
    randomize_norm_statistics(model, 2)
    return example(model, features(1, 16, 40))


def ta_conformer() -> Example:
    from torchaudio.models import Conformer

    torch.manual_seed(0)
    model = Conformer(
        input_dim=64, num_heads=4, ffn_dim=128, num_layers=2, depthwise_conv_kernel_size=15,
    )  # fmt: skip
    randomize_norm_statistics(model, 2)
    lengths = torch.tensor([50])
    return example(Pick(model, 0), features(1, 50, 64), lengths)


def ta_wavernn() -> Example:
    from torchaudio.models import WaveRNN

    torch.manual_seed(0)
    model = WaveRNN(
        upsample_scales=[2, 2], n_classes=16, hop_length=4, n_res_block=2, n_rnn=32, n_fc=32,
        kernel_size=5, n_freq=16, n_hidden=32, n_output=32,
    )  # fmt: skip
    randomize_norm_statistics(model, 2)
    # The waveform covers (frames - kernel_size + 1) hops; its GRUs run once
    # per sample, unrolled by export, so it is kept short.
    frames = 8
    return example(model, features(1, 1, (frames - 4) * 4), features(1, 1, 16, frames, seed=2))


def ta_hdemucs() -> Example:
    from torchaudio.models import HDemucs

    torch.manual_seed(0)
    model = HDemucs(sources=["a", "b"], audio_channels=1, channels=8, nfft=64, depth=2)
    return example(model, audio(1024).unsqueeze(1))


# The catalogue ----------------------------------------------------------------------------

SWEEP: dict[str, SweepModel] = {
    m.name: m
    for m in [
        # wav2vec2 family (transformers)
        SweepModel("hf_wav2vec2_group", "transformers Wav2Vec2Model (group norm)",
                   hidden("Wav2Vec2Config", "Wav2Vec2Model", **W2V, feat_extract_norm="group")),
        SweepModel("hf_wav2vec2_layer", "transformers Wav2Vec2Model (layer norm, stable)",
                   hidden("Wav2Vec2Config", "Wav2Vec2Model", **W2V, feat_extract_norm="layer",
                          do_stable_layer_norm=True)),
        SweepModel("hf_hubert", "transformers HubertModel",
                   hidden("HubertConfig", "HubertModel", **W2V)),
        SweepModel("hf_wavlm", "transformers WavLMModel",
                   hidden("WavLMConfig", "WavLMModel", **W2V, num_buckets=32,
                          max_bucket_distance=100)),
        SweepModel("hf_data2vec_audio", "transformers Data2VecAudioModel",
                   hidden("Data2VecAudioConfig", "Data2VecAudioModel",
                          **dict(W2V, num_conv_pos_embeddings=5), conv_pos_kernel_size=5)),
        SweepModel("hf_sew", "transformers SEWModel",
                   hidden("SEWConfig", "SEWModel", **W2V, squeeze_factor=2)),
        SweepModel("hf_sew_d", "transformers SEWDModel",
                   hidden("SEWDConfig", "SEWDModel", **W2V, squeeze_factor=2,
                          position_buckets=16, max_position_embeddings=64)),
        SweepModel("hf_unispeech_sat", "transformers UniSpeechSatModel",
                   hidden("UniSpeechSatConfig", "UniSpeechSatModel", **W2V)),
        SweepModel("hf_wav2vec2_conformer", "transformers Wav2Vec2ConformerModel",
                   hidden("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel", **W2V,
                          conv_depthwise_kernel_size=7, position_embeddings_type="relative")),
        SweepModel("hf_wav2vec2_bert", "transformers Wav2Vec2BertModel", wav2vec2_bert),
        SweepModel("hf_seamless_m4t_v2_speech_encoder",
                   "transformers SeamlessM4Tv2SpeechEncoder", seamless_m4t_v2_speech_encoder),
        # other speech encoders (transformers)
        SweepModel("hf_whisper_encoder", "transformers WhisperModel.encoder", whisper_encoder),
        SweepModel("hf_moonshine_encoder", "transformers MoonshineModel.encoder",
                   moonshine_encoder),
        SweepModel("hf_speech2text_encoder", "transformers Speech2TextModel.encoder",
                   speech2text_encoder),
        SweepModel("hf_qwen2_audio_encoder", "transformers Qwen2AudioEncoder", qwen2_audio_encoder),
        SweepModel("hf_gemma3n_audio_encoder", "transformers Gemma3nAudioEncoder",
                   gemma3n_audio_encoder),
        SweepModel("hf_phi4_multimodal_audio", "transformers Phi4MultimodalAudioModel",
                   phi4_multimodal_audio),
        # codecs and vocoders (transformers)
        SweepModel("hf_dac_encoder", "transformers DacModel.encoder", dac_encoder),
        SweepModel("hf_encodec_encoder", "transformers EncodecModel.encoder", encodec_encoder),
        SweepModel("hf_speecht5_hifigan", "transformers SpeechT5HifiGan", speecht5_hifigan),
        SweepModel("hf_fastspeech2_conformer_hifigan", "transformers FastSpeech2ConformerHifiGan",
                   fastspeech2_conformer_hifigan),
        SweepModel("hf_univnet", "transformers UnivNetModel", univnet),
        SweepModel("hf_fastspeech2_conformer", "transformers FastSpeech2ConformerModel",
                   fastspeech2_conformer),
        SweepModel("hf_vits", "transformers VitsModel", vits),
        # text encoders with convs (transformers)
        SweepModel("hf_convbert", "transformers ConvBertModel", convbert),
        SweepModel("hf_squeezebert", "transformers SqueezeBertModel", squeezebert),
        # causal LMs with convs (transformers)
        SweepModel("hf_mamba", "transformers MambaForCausalLM", mamba),
        SweepModel("hf_mamba2", "transformers Mamba2ForCausalLM", mamba2),
        SweepModel("hf_falcon_mamba", "transformers FalconMambaForCausalLM", falcon_mamba),
        SweepModel("hf_bamba", "transformers BambaForCausalLM", bamba),
        SweepModel("hf_granite_moe_hybrid", "transformers GraniteMoeHybridForCausalLM",
                   granite_moe_hybrid),
        SweepModel("hf_granite_hybrid_dense", "transformers GraniteMoeHybridForCausalLM "
                   "(no experts)", granite_hybrid_dense),
        SweepModel("hf_falcon_h1", "transformers FalconH1ForCausalLM", falcon_h1),
        SweepModel("hf_jamba", "transformers JambaForCausalLM", jamba),
        SweepModel("hf_jamba_dense", "transformers JambaForCausalLM (no experts)",
                   lambda: jamba(experts=False)),
        SweepModel("hf_zamba2", "transformers Zamba2ForCausalLM", zamba2),
        SweepModel("hf_nemotron_h", "transformers NemotronHForCausalLM", nemotron_h),
        SweepModel("hf_qwen3_next", "transformers Qwen3NextForCausalLM", qwen3_next),
        SweepModel("hf_qwen3_next_dense", "transformers Qwen3NextForCausalLM (no experts)",
                   lambda: qwen3_next(experts=False)),
        SweepModel("hf_qwen3_5_text", "transformers Qwen3_5ForCausalLM", qwen3_5_text),
        SweepModel("hf_lfm2_moe", "transformers Lfm2MoeForCausalLM", lfm2_moe),
        SweepModel("hf_recurrent_gemma", "transformers RecurrentGemmaForCausalLM",
                   recurrent_gemma),
        # torchaudio
        SweepModel("ta_wav2vec2_base_arch", "torchaudio wav2vec2_model (wav2vec2_base / "
                   "hubert_base architecture)", lambda: _ta_wav2vec2("group_norm", False, False)),
        SweepModel("ta_wav2vec2_large_arch", "torchaudio wav2vec2_model (wav2vec2_large_lv60k / "
                   "hubert_large architecture)", lambda: _ta_wav2vec2("layer_norm", True, True)),
        SweepModel("ta_wavlm", "torchaudio wavlm_model", ta_wavlm),
        SweepModel("ta_conv_tasnet", "torchaudio ConvTasNet", ta_conv_tasnet),
        SweepModel("ta_tacotron2_postnet", "torchaudio Tacotron2's _Postnet", ta_tacotron2_postnet),
        SweepModel("ta_conformer", "torchaudio Conformer", ta_conformer),
        SweepModel("ta_wavernn", "torchaudio WaveRNN", ta_wavernn),
        SweepModel("ta_hdemucs", "torchaudio HDemucs", ta_hdemucs),
    ]
}  # fmt: skip

__all__ = ["SWEEP", "SweepModel"]
