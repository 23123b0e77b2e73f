"""Rule three of issue 16 on upstream modules: whatever computes a conv's weight
or bias from constants at export (views, weight normalization, BatchNorm
statistics) is folded into a constant of the blob, never handed to the delegate
as an input read in the wrong layout.

transformers' ``Lfm2ShortConv`` passes ``self.conv.weight.squeeze(1).unsqueeze(1)``
to ``F.conv1d``; before the fix those views stayed outside the delegate, the
weight arrived as a run-time input and the depthwise channels-last walk used
taps prepared at ``init`` from a zero buffer: an error as large as the output
from sequence length 32 on.
"""

import pytest
import torch
from conftest import assert_close, delegate_backends, run_pte_runner, run_runtime, save
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules
from rustconv import RustConvPartitioner
from torch.export import export

FLOWS = ("to_edge", "transform")


def _lower(model, inputs, flow, partitioners):
    ep = export(model.eval(), inputs)
    if flow == "transform":
        return to_edge_transform_and_lower(ep, partitioner=partitioners)
    edge = to_edge(ep)
    for partitioner in partitioners:
        edge = edge.to_backend(partitioner)
    return edge


def _rustconv_inputs(edge) -> list[int]:
    """Number of inputs of each RustConv call (constants are not inputs)."""
    gm = edge.exported_program().graph_module
    counts = []
    for node in gm.graph.nodes:
        if node.target is torch.ops.higher_order.executorch_call_delegate:
            lm = getattr(gm, node.args[0].target)
            if lm.backend_id == "RustConvBackend":
                counts.append(len(node.args) - 1)
    return counts


def _check(model, inputs, flow, partitioners, tmp_path, *, calls=1, delegate_inputs=1):
    """Lowers, checks the RustConv calls and their inputs, runs both runtimes."""
    want = model(*inputs)
    edge = _lower(model, inputs, flow, partitioners)
    assert _rustconv_inputs(edge) == [delegate_inputs] * calls, edge.exported_program().graph
    program = edge.to_executorch()
    assert delegate_backends(program).count("RustConvBackend") == calls
    pte = save(program, tmp_path)
    atol = 1e-4 * max(1.0, want.abs().max().item())
    assert_close(run_runtime(pte, inputs)[0], want, f"{flow} runtime", atol)
    assert_close(run_pte_runner(pte, inputs, tmp_path)[0], want, f"{flow} pte_runner", atol)
    return edge


class _Call(torch.nn.Module):
    """Calls ``module(x)``: export sees the upstream module's forward."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("width,length", [(64, 32), (256, 96)])
def test_lfm2_short_conv_weight_views_are_folded(width, length, flow, tmp_path):
    from transformers.models.lfm2.configuration_lfm2 import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    torch.manual_seed(0)
    config = Lfm2Config(hidden_size=width, conv_L_cache=3, conv_bias=False)
    model = _Call(Lfm2ShortConv(config, layer_idx=0)).eval()
    x = torch.randn(1, length, width)
    # The linears go elsewhere; the call's only input is the in_proj output.
    _check(model, (x,), flow, [RustConvPartitioner()], tmp_path)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("form", ["parametrizations", "hook"])
def test_weight_normalized_convs_are_folded(form, flow, tmp_path):
    """``g * v / ||v||`` (both weight_norm APIs) becomes the blob's weight."""
    torch.manual_seed(0)
    wrap = (
        torch.nn.utils.parametrizations.weight_norm
        if form == "parametrizations"
        else torch.nn.utils.weight_norm
    )
    model = torch.nn.Sequential(
        wrap(torch.nn.Conv1d(16, 32, 5, padding=2)),
        torch.nn.SiLU(),
        wrap(torch.nn.Conv1d(32, 16, 3, padding=1, groups=16)),
    ).eval()
    x = torch.randn(1, 16, 48)
    _check(model, (x,), flow, [RustConvPartitioner()], tmp_path)


def _parakeet_conv_module(width=32, kernel=9):
    from transformers.models.parakeet.configuration_parakeet import ParakeetEncoderConfig
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoderConvolutionModule

    torch.manual_seed(0)
    config = ParakeetEncoderConfig(hidden_size=width, conv_kernel_size=kernel)
    module = ParakeetEncoderConvolutionModule(config).eval()
    # Non-trivial statistics, so a BatchNorm left out or folded wrongly shows.
    with torch.no_grad():
        module.norm.running_mean.normal_()
        module.norm.running_var.uniform_(0.5, 2.0)
        module.norm.weight.normal_()
        module.norm.bias.normal_()
    return _Call(module).eval()


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("with_xnnpack", [False, True], ids=["alone", "xnnpack"])
def test_conformer_conv_module_is_one_call(with_xnnpack, flow, tmp_path):
    """transformers' FastConformer conv module (pointwise conv, GLU, depthwise
    K=9, BatchNorm in eval mode, SiLU, pointwise conv): one RustConv call, the
    BatchNorm folded into the depthwise conv, nothing left outside."""
    model = _parakeet_conv_module()
    partitioners = [RustConvPartitioner()] + ([XnnpackPartitioner()] if with_xnnpack else [])
    x = torch.randn(1, 40, 32)
    edge = _check(model, (x,), flow, partitioners, tmp_path)
    gm = edge.exported_program().graph_module
    assert [lm.backend_id for _, lm, _ in get_lowered_submodules(gm)] == ["RustConvBackend"]
    leftover = [
        n.name
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is not torch.ops.higher_order.executorch_call_delegate
        and "getitem" not in n.name
    ]
    assert leftover == []


class _ConvReluBatchNorm(torch.nn.Module):
    """A BatchNorm that cannot be folded into a conv: a per-channel affine."""

    def __init__(self, channels=12):
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, 7, padding=3, groups=channels)
        self.bn = torch.nn.BatchNorm1d(channels)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.normal_()

    def forward(self, x):
        return self.bn(torch.relu(self.conv(x)))


@pytest.mark.parametrize("flow", FLOWS)
def test_batch_norm_after_an_activation_runs_in_the_delegate(flow, tmp_path):
    torch.manual_seed(0)
    _check(
        _ConvReluBatchNorm().eval(),
        (torch.randn(2, 12, 50),),
        flow,
        [RustConvPartitioner()],
        tmp_path,
    )
