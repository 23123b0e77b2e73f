"""LeakyReLU and PReLU (``aten.leaky_relu``, ``aten.prelu``) run in the fused
kernels as the comparison, multiply and select they are
(ops_lowering/rectifiers.py): a HiFi-GAN vocoder's or a ConvTasNet
separator's conv chain no longer splits at every activation, and a PReLU
between two RustConv calls no longer reaches XNNPACK alone, whose lowering
of it failed (its channels-last pass: "Attempting to convert non-NHWC
compatible node to NHWC"), so that the model did not lower at all.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import ConvActConv, run_activation_model, zoo_example
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from torch.export import export

ACTIVATIONS = {
    "leaky_relu_0.2": lambda: torch.nn.LeakyReLU(0.2),
    "leaky_relu_negative": lambda: torch.nn.LeakyReLU(-0.5),
    "prelu_per_channel": lambda: torch.nn.PReLU(8, init=0.3),
    "prelu_one": lambda: torch.nn.PReLU(init=-0.2),
}


def _model(act: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = ConvActConv(ACTIVATIONS[act]())
    if act == "prelu_per_channel":  # a different slope per channel, some negative
        with torch.no_grad():
            model.act.weight.copy_(torch.linspace(-0.5, 0.8, 8))
    return model


# Every activation with XNNPACK after RustConv (where a PReLU left alone
# failed), two of them with RustConv alone.
@pytest.mark.parametrize(
    "act,flow",
    [(act, "transform") for act in ACTIVATIONS]
    + [("leaky_relu_0.2", "to_edge"), ("prelu_per_channel", "to_edge")],
)
def test_rectifier_between_convs_is_one_call(act, flow, tmp_path):
    x = torch.randn(2, 8, 30) * 3
    x[0, :, :3] = -0.0
    calls, leftover = run_activation_model(_model(act), (x,), flow, tmp_path)
    assert (calls, leftover) == (1, [])


class PReluOnTime(torch.nn.Module):
    """PReLU on a ``[B, C]`` tensor (a conv's output summed over time): the
    per-channel weight is then the last dimension."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 3)
        self.act = torch.nn.PReLU(8)
        with torch.no_grad():
            self.act.weight.copy_(torch.linspace(-1.0, 1.0, 8))

    def forward(self, x):
        return self.act(self.conv(x).sum(-1))


def test_prelu_on_two_dimensions_broadcasts_along_channels(tmp_path):
    x = torch.randn(3, 8, 20)
    calls, leftover = run_activation_model(PReluOnTime(), (x,), "transform", tmp_path)
    assert calls == 1 and not [op for op in leftover if "prelu" in op], leftover


class PReluWeightFromInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 3)

    def forward(self, x, w):
        return F.prelu(self.conv(x), w)


def test_prelu_weight_given_at_run_time_is_left_with_the_reason():
    ep = export(PReluWeightFromInput().eval(), (torch.randn(1, 8, 10), torch.rand(8)))
    reasons = RustConvPartitioner().explain(ep)
    (reason,) = [r for name, r in reasons.items() if "prelu" in name]
    assert "constant" in reason, reasons


def test_prelu_weight_given_at_run_time_still_lowers_and_runs():
    """Left to XNNPACK or the portable kernels, the model still lowers."""
    model = PReluWeightFromInput().eval()
    inputs = (torch.randn(1, 8, 10), torch.rand(8))
    edge = to_edge_transform_and_lower(
        export(model, inputs), partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
    )
    edge.to_executorch()


def test_torchaudio_convtasnet_lowers_with_xnnpack_after_rustconv(tmp_path):
    """torchaudio's ConvTasNet (PReLU between its depthwise separable convs):
    XNNPACK alone fails to lower it (its channels-last pass, on a PReLU), and
    so did [RustConv, XNNPACK] while RustConv left the PReLUs to XNNPACK. Now
    RustConv takes the separator whole, and the transposed-conv decoder (a
    second call); XNNPACK only the mask's view ``[B, S*F, T] -> [B, S, F, T]``
    between them, a reshape that splits a dimension, which RustConv leaves."""
    from torchaudio.models import ConvTasNet

    torch.manual_seed(0)
    model = ConvTasNet(
        num_sources=2, enc_kernel_size=16, enc_num_feats=32, msk_kernel_size=3,
        msk_num_feats=16, msk_num_hidden_feats=32, msk_num_layers=2, msk_num_stacks=1,
    )  # fmt: skip
    calls, leftover = run_activation_model(model, (torch.randn(1, 1, 800),), "transform", tmp_path)
    assert calls == 2 and not [op for op in leftover if "prelu" in op], leftover


def test_speecht5_hifigan_is_one_call_in_to_edge(tmp_path):
    """transformers' SpeechT5 HiFi-GAN (the zoo's, tests' size: leaky ReLUs
    between dilated convs, two ConvTranspose1d upsamplers) is one RustConv call
    through ``to_edge(...).to_backend(...)`` too, nothing left outside
    (tests/zoo checks one call through to_edge_transform_and_lower, and the
    outputs at 1e-4 of their scale)."""
    example = zoo_example("hf_speecht5_hifigan")
    calls, leftover = run_activation_model(example.module, example.inputs, "to_edge", tmp_path)
    assert calls == 1 and not leftover, leftover
