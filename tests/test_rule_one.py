"""Rule one of issue 16: RustConvPartitioner in a partitioner list never changes
what the other partitioners see or produce (rustconv.devtools.testing.check_others_unchanged),
and quantized graphs still export and run with RustConv first (section 5).

Before the fix, RustConv's decomposition pass (ExecuTorch 1.5.1 runs one per
partitioner) decomposed XNNPACK's ``aten.linear``, so XNNPACK saw ``mm`` and
its 8da4w dynamic-quant linears fell back; and RustConv took PT2E-quantized
convs in float, leaving their ``dequantize_per_channel`` without a kernel.
"""

import copy

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from rustconv import RustConvPartitioner
from rustconv.devtools.testing import check_others_unchanged, transform_and_lower
from torch.export import export


class _Call(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def test_lfm2_short_conv_block_with_its_linears():
    """transformers' Lfm2ShortConv (in_proj, short conv, out_proj) beside XNNPACK."""
    from transformers.models.lfm2.configuration_lfm2 import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    torch.manual_seed(0)
    config = Lfm2Config(hidden_size=64, conv_L_cache=3, conv_bias=False)
    model = _Call(Lfm2ShortConv(config, layer_idx=0)).eval()
    x = torch.randn(1, 32, 64)
    report = check_others_unchanged(
        transform_and_lower(lambda: export(model, (x,))),
        lambda: [XnnpackPartitioner()],
        inputs=(x,),
        atol=1e-5,
    )
    # XNNPACK keeps both linears whole (one call each), RustConv the rest.
    backends = [c.backend_id for c in report.first.calls]
    assert backends == ["XnnpackBackend", "RustConvBackend", "XnnpackBackend"]
    torch.testing.assert_close(report.outputs["first"][0], model(x), atol=1e-5, rtol=0)


def _recipe_partitioners():
    from executorch.extension.llm.export.partitioner_lib import get_xnnpack_partitioner

    return [
        get_xnnpack_partitioner(dynamic_quant_only_partitioner=True),
        get_xnnpack_partitioner(dynamic_quant_only_partitioner=False),
    ]


def test_executorch_short_conv_between_8da4w_linears():
    """ExecuTorch's own LFM2 ShortConv (examples/models/lfm2), its four linears
    quantized by the recipe's own 8da4w transform (torchao dynamic int8
    activations, int4 weights, group 128), lowered with the recipe's
    partitioners: XNNPACK keeps its quantized linears, RustConv takes the
    float short conv between them, outputs equal."""
    from executorch.examples.models.lfm2.short_conv import ShortConv
    from executorch.examples.models.llama.source_transformation.quantize import quantize

    torch.manual_seed(0)
    model = quantize(ShortConv(128).eval(), "8da4w", group_size=128)
    x = torch.randn(1, 8, 128)
    want = copy.deepcopy(model)(x)  # a copy: the call updates conv_state
    report = check_others_unchanged(
        transform_and_lower(lambda: export(model, (x,))),
        _recipe_partitioners,
        inputs=(x,),
        atol=1e-5,
        orders=("first",),  # last: covered by the LFM2 block above; 20 s a lowering here
    )
    calls = report.first.calls
    assert [c.backend_id for c in calls].count("RustConvBackend") == 1
    (ours,) = [c for c in calls if c.backend_id == "RustConvBackend"]
    assert any("convolution" in n for n in ours.nodes)
    assert not any("quantize" in n or "linear" in n for n in ours.nodes)
    scale = want.abs().max().item()
    # Against the quantized eager model: its own dynamic-quantization error.
    assert (report.outputs["first"][0] - want).abs().max().item() < 0.02 * scale


def test_delegate_state_starts_from_zero_like_executorchs_buffers():
    """A short conv run in eager before export holds a non-zero conv_state.
    ExecuTorch keeps no initial value for a mutated buffer (its runtimes start
    it zeroed); the state RustConv owns starts from zero too, so the program
    computes the same with RustConv as without it (before: from the exported
    value, an error of half the output's scale)."""
    from executorch.examples.models.lfm2.short_conv import ShortConv

    torch.manual_seed(0)
    model = ShortConv(64).eval()
    x = torch.randn(1, 8, 64)
    fresh = copy.deepcopy(model)
    model(torch.randn(1, 8, 64))  # the eager call leaves conv_state non-zero
    assert model.conv_state.abs().max() > 0
    report = check_others_unchanged(
        transform_and_lower(lambda: export(model, (x,))),
        lambda: [XnnpackPartitioner()],
        inputs=(x,),
        atol=1e-5,
        orders=("first",),
    )
    torch.testing.assert_close(report.outputs["first"][0], fresh(x), atol=1e-5, rtol=0)


def _pt2e_conv_stack(channels, layers, length=64):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    stack = []
    for _ in range(layers):
        stack += [torch.nn.Conv1d(channels, channels, 11, padding=5), torch.nn.ReLU()]
    model = torch.nn.Sequential(*stack).eval()
    x = torch.randn(1, channels, length)
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    graph = prepare_pt2e(export(model, (x,)).module(), quantizer)
    graph(x)  # calibration
    return convert_pt2e(graph), x


def _check_pt2e_stack(channels, layers):
    quantized, x = _pt2e_conv_stack(channels, layers)
    want = quantized(x)
    report = check_others_unchanged(
        transform_and_lower(lambda: export(quantized, (x,))),
        lambda: [XnnpackPartitioner()],
        inputs=(x,),
        atol=0.0,
        min_rustconv_calls=0,
        orders=("first",),  # last, XNNPACK has taken everything before RustConv looks
    )
    # Every quantized conv stays with XNNPACK, which runs it in int8.
    assert not [c for c in report.first.calls if c.backend_id == "RustConvBackend"]
    step = 2 * max(abs(want).max().item() / 127, 1e-6)
    assert (report.outputs["first"][0] - want).abs().max().item() <= step
    return quantized, x


def test_pt2e_quantized_conv_stack_stays_with_xnnpack_and_explain_says_why():
    """The issue's model (12 dense convs, K=11, PT2E per-channel int8) at 16
    channels: exports, runs equal to the XNNPACK-only program, every conv
    in XNNPACK, and explain() says why for each of the 12."""
    quantized, x = _check_pt2e_stack(channels=16, layers=12)
    # (explain() on the exported ATen program: a to_edge of it costs 20 s here.)
    reasons = RustConvPartitioner().explain(export(quantized, (x,)))
    convs = {n: r for n, r in reasons.items() if n.startswith("conv1d")}
    assert len(convs) == 12
    assert all("dequantize" in r and "quantizing backend" in r for r in convs.values()), convs


class _ShortConvBlock(torch.nn.Module):
    """in_proj, causal depthwise conv (K=3) over time, out_proj."""

    def __init__(self, width=64):
        super().__init__()
        self.in_proj = torch.nn.Linear(width, width)
        self.conv = torch.nn.Conv1d(width, width, 3, padding=2, groups=width)
        self.out_proj = torch.nn.Linear(width, width)

    def forward(self, x):
        h = self.conv(self.in_proj(x).transpose(1, 2))[..., : x.shape[1]]
        return self.out_proj(h.transpose(1, 2))


def test_float_short_conv_between_pt2e_quantized_linears_is_ours():
    """Linears quantized with PT2E (XNNPACKQuantizer, per-channel int8 weights,
    dynamic int8 activations), the conv between them left in float: XNNPACK
    takes each quantized linear with its quantize/dequantize, RustConv the
    conv, and the program computes what the XNNPACK-only one does.

    (Static activation quantization of the linears alone puts a
    quantize/dequantize pair on the conv's input, which XNNPACK alone
    already fails to lower: "Weight and Input should both be quantized".)"""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model, x = _ShortConvBlock().eval(), torch.randn(1, 32, 64)
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    quantizer = XNNPACKQuantizer().set_module_type(torch.nn.Linear, config)
    graph = prepare_pt2e(export(model, (x,)).module(), quantizer)
    graph(x)
    quantized = convert_pt2e(graph)
    want = quantized(x)
    report = check_others_unchanged(
        transform_and_lower(lambda: export(quantized, (x,))),
        lambda: [XnnpackPartitioner()],
        inputs=(x,),
        atol=1e-4 * want.abs().max().item(),
        orders=("first",),
    )
    calls = report.first.calls
    assert [c.backend_id for c in calls] == ["XnnpackBackend", "RustConvBackend", "XnnpackBackend"]
    (ours,) = [c for c in calls if c.backend_id == "RustConvBackend"]
    assert any("convolution" in n for n in ours.nodes)
    assert not any("quantize" in n or "addmm" in n or "linear" in n for n in ours.nodes)
    # Against the quantized eager model: its own dynamic-quantization error.
    step = 2 * want.abs().max().item() / 127
    assert (report.outputs["first"][0] - want).abs().max().item() <= 4 * step


@pytest.mark.slow
def test_pt2e_quantized_conv_stack_of_the_issue():
    """The issue's 12 dense convs (250 channels, K=11) quantized per channel:
    ``Missing out variants: {'quantized_decomposed::dequantize_per_channel'}``
    at to_executorch with RustConv first, before."""
    _check_pt2e_stack(channels=250, layers=12)
