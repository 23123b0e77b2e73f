"""GLU (issue 16, section 4): ``F.glu``/``nn.GLU`` runs in the fused kernels as
two slices of its input, a sigmoid and a multiply, whether it reaches the
partitioner decomposed (ExecuTorch's default table) or whole (another
partitioner of the list keeps ``aten.glu``; ``explain()`` on an ATen program).

The conformer convolution module, from transformers (FastConformer's, in
test_constant_weights.py) and torchaudio (here): pointwise conv, GLU over the
channels, depthwise conv, BatchNorm (eval), SiLU, pointwise conv is exactly
one RustConv call with no portable op left, in both lowering flows.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, delegate_backends, run_pte_runner, run_runtime, save
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from executorch.exir.lowered_backend_module import get_lowered_submodules
from rustconv import RustConvPartitioner
from torch.export import Dim, export

_DELEGATE = torch.ops.higher_order.executorch_call_delegate


class KeepGlu(Partitioner):
    """Takes nothing but keeps ``aten.glu`` whole: GLU reaches RustConv undecomposed."""

    def partition(self, exported_program):
        return PartitionResult(tagged_exported_program=exported_program, partition_tags={})

    def ops_to_not_decompose(self, ep):
        return [torch.ops.aten.glu.default], None


class ConvGluConv(torch.nn.Module):
    def __init__(self, channels=8, dim=1):
        super().__init__()
        self.dim = dim
        gated_channels = 2 * channels if dim in (1, -2) else channels
        self.up = torch.nn.Conv1d(channels, gated_channels, 1)
        self.dw = torch.nn.Conv1d(channels, channels, 5, padding=2, groups=channels)

    def forward(self, x):
        return self.dw(F.glu(self.up(x), dim=self.dim))


def _lower(model, inputs, flow, dynamic_shapes=None):
    ep = export(model, inputs, dynamic_shapes=dynamic_shapes)
    if flow == "to_edge":
        return to_edge(ep).to_backend(RustConvPartitioner())
    if flow == "to_edge+xnnpack":
        return to_edge(ep).to_backend(RustConvPartitioner()).to_backend(XnnpackPartitioner())
    if flow == "transform":
        return to_edge_transform_and_lower(ep, partitioner=[RustConvPartitioner()])
    if flow == "transform+xnnpack":
        partitioners = [RustConvPartitioner(), XnnpackPartitioner()]
        return to_edge_transform_and_lower(ep, partitioner=partitioners)
    # (Not with XNNPACK too: its own decomposition pass would decompose glu.)
    assert flow == "transform+keep_glu"
    partitioners = [RustConvPartitioner(), KeepGlu()]
    return to_edge_transform_and_lower(ep, partitioner=partitioners)


def _check_one_call(model, inputs, flow, tmp_path):
    """Exactly one RustConv call, no other delegate or op left, equal to eager."""
    model = model.eval()
    want = model(*inputs)
    edge = _lower(model, inputs, flow)
    gm = edge.exported_program().graph_module
    assert [lm.backend_id for _, lm, _ in get_lowered_submodules(gm)] == ["RustConvBackend"]
    leftover = [
        str(n.target)
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not _DELEGATE and "getitem" not in n.name
    ]
    assert leftover == [], gm.graph
    program = edge.to_executorch()
    assert delegate_backends(program) == ["RustConvBackend"]
    assert not program.executorch_program.execution_plan[0].operators, "a portable op is left"
    pte = save(program, tmp_path)
    atol = 1e-4 * max(1.0, want.abs().max().item())
    assert_close(run_runtime(pte, inputs)[0], want, f"{flow} runtime", atol)
    assert_close(run_pte_runner(pte, inputs, tmp_path)[0], want, f"{flow} pte_runner", atol)
    return edge


FLOWS = ("to_edge", "to_edge+xnnpack", "transform", "transform+xnnpack", "transform+keep_glu")


@pytest.mark.parametrize("flow", FLOWS)
def test_glu_between_convs_is_one_call(flow, tmp_path):
    torch.manual_seed(0)
    _check_one_call(ConvGluConv(), (torch.randn(2, 8, 40),), flow, tmp_path)


def test_glu_reaches_the_partitioner_whole_and_is_taken():
    """With a partitioner keeping aten.glu, the program RustConv partitions has
    the glu node itself, and explain() does not refuse it."""
    torch.manual_seed(0)
    model, x = ConvGluConv().eval(), torch.randn(1, 8, 16)
    seen = []

    class Recording(RustConvPartitioner):
        def partition(self, exported_program):
            seen.extend(str(n.target) for n in exported_program.graph.nodes)
            assert self.explain(exported_program) == {}
            return super().partition(exported_program)

    to_edge_transform_and_lower(export(model, (x,)), partitioner=[Recording(), KeepGlu()])
    assert any("aten.glu.default" in s for s in seen), seen
    # ... and on the ATen program, before any decomposition.
    assert RustConvPartitioner().explain(export(model, (x,))) == {}


@pytest.mark.parametrize("dim", [2, -1])
def test_glu_over_time_is_taken(dim, tmp_path):
    """GLU over the (static) time axis: the halves are time slices."""
    torch.manual_seed(0)
    _check_one_call(ConvGluConv(dim=dim), (torch.randn(1, 8, 24),), "transform+keep_glu", tmp_path)


def _glu_reason(model, x, dynamic_shapes=None) -> str:
    ep = export(model.eval(), (x,), dynamic_shapes=dynamic_shapes)
    reasons = RustConvPartitioner().explain(ep)
    (reason,) = [r for name, r in reasons.items() if name.startswith("glu")]
    return reason


def test_glu_of_odd_size_is_refused_with_a_reason():
    class OddGlu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            return F.glu(self.conv(x), dim=2)

    # torch itself raises on an odd size when it runs; the partitioner refuses
    # it whatever the graph's metadata says (a traced odd size only shows in
    # explain() of a graph that could never run, so check the lowering directly).
    from rustconv.export.ops_lowering.common import NotSupported
    from rustconv.export.ops_lowering.glu import glu_params

    ep = export(OddGlu().eval(), (torch.randn(1, 4, 10),))
    (node,) = [n for n in ep.graph.nodes if n.target is torch.ops.aten.glu.default]
    node.args[0].meta["val"] = torch.empty(1, 4, 11)
    with pytest.raises(NotSupported, match="odd size 11"):
        glu_params(node)


def test_glu_over_a_dynamic_dim_is_refused_with_a_reason():
    class TimeGlu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            return self.conv(F.glu(x, dim=2))

    length = Dim("half", min=2, max=64)
    reason = _glu_reason(TimeGlu(), torch.randn(1, 4, 20), ({2: 2 * length},))
    assert "dynamic" in reason, reason


@pytest.mark.parametrize("flow", ("to_edge", "transform", "transform+xnnpack"))
@pytest.mark.parametrize("norm", ["batch", "group"])
def test_torchaudio_conformer_conv_module_is_one_call(norm, flow, tmp_path):
    """torchaudio 2.11's conformer convolution module (LayerNorm, pointwise
    conv, nn.GLU(dim=1), depthwise K=31, BatchNorm or GroupNorm, SiLU,
    pointwise conv), eval mode, random weights and statistics."""
    from torchaudio.models.conformer import _ConvolutionModule

    torch.manual_seed(0)
    module = _ConvolutionModule(
        input_dim=32, num_channels=32, depthwise_kernel_size=31, bias=True,
        use_group_norm=norm == "group",
    ).eval()  # fmt: skip
    with torch.no_grad():
        norm_layer = module.sequential[3]
        norm_layer.weight.normal_()
        norm_layer.bias.normal_()
        if norm == "batch":
            norm_layer.running_mean.normal_()
            norm_layer.running_var.uniform_(0.5, 2.0)
    _check_one_call(module, (torch.randn(1, 50, 32),), flow, tmp_path)
