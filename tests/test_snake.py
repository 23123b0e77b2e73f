"""``sin`` and ``cos`` run in the fused kernels (kernels/src/fused/math.rs),
so the Snake activation of audio codecs (``x + sin(a x)^2 / a``: DAC,
BigVGAN) fuses with the convs around it: transformers' DAC encoder was a
RustConv call per conv, 16 in all, with ``sin`` left to the portable kernel
between them.
"""

import pytest
import torch
from conftest import ConvActConv, run_activation_model


class Snake(torch.nn.Module):
    """transformers' ``Snake1d`` (models/dac), as it computes it."""

    def __init__(self, channels: int, scale: float = 1.0):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.linspace(0.5, 2.0, channels).view(1, -1, 1) * scale)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(shape[0], shape[1], -1)
        x = x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)
        return x.reshape(shape)


class Cosine(torch.nn.Module):
    def forward(self, x):
        return torch.cos(x) * x


@pytest.mark.parametrize(
    "act,flow", [("snake", "transform"), ("snake", "to_edge"), ("cos", "transform")]
)
def test_trig_activation_between_convs_is_one_call(act, flow, tmp_path):
    torch.manual_seed(0)
    model = ConvActConv(Snake(8) if act == "snake" else Cosine())
    calls, leftover = run_activation_model(model, (torch.randn(2, 8, 40) * 4,), flow, tmp_path)
    assert (calls, leftover) == (1, [])


def test_sin_of_arguments_beyond_the_vector_range_is_libms(tmp_path):
    """A slice with |a x| above 8192 takes libm's sine (the vector one's
    reduction is exact only below): the result is still PyTorch's."""
    torch.manual_seed(0)
    model = ConvActConv(Snake(8, scale=3000.0))
    x = torch.randn(1, 8, 40) * 4
    calls, leftover = run_activation_model(model, (x,), "transform", tmp_path)
    assert (calls, leftover) == (1, [])


def test_dac_encoder_is_one_call(tmp_path):
    """transformers' DacModel encoder (Snake1d before every conv, residual
    units, strided downsampling convs): one RustConv call."""
    from transformers import DacConfig, DacModel

    torch.manual_seed(0)
    config = DacConfig(
        encoder_hidden_size=8,
        downsampling_ratios=[2],
        decoder_hidden_size=32,
        n_codebooks=2,
        codebook_size=64,
        codebook_dim=4,
        hidden_size=64,
    )
    encoder = DacModel(config).encoder.eval()
    calls, leftover = run_activation_model(
        encoder, (torch.randn(1, 1, 1024),), "transform", tmp_path
    )
    assert (calls, leftover) == (1, [])
