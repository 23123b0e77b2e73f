"""Transposed 1-D convolutions (``nn.ConvTranspose1d``) run in RustConv: a
stride-1 conv of their phases, interleaved by two reshapes and a permute
(``rustconv.export.ops_lowering.conv_transpose``).

One model holds a grid of transposed convs side by side (one export, one
lowering for all of them): K not a multiple of the stride, K below it,
padding, output padding, dilation 2, groups, stride 1, with and without bias,
through ``executorch.runtime`` and ``pte_runner``, reaching RustConv as
``aten.convolution`` (transposed) or kept whole as ``aten.conv_transpose1d``.
Then a HiFi-GAN upsampling block lands in one RustConv call beside XNNPACK, a
dynamic length runs at several lengths, the blob holds the phase weights and
not the original ones, and what is refused says why.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, delegate_backends, run_pte_runner, run_runtime, save
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from rustconv import RustConvPartitioner
from rustconv.export.ops_lowering.conv_transpose import phase_weight
from rustconv.fb.ValueKind import ValueKind
from rustconv_test_helpers import blob_graph, lowered_modules
from torch import nn
from torch.export import Dim, export

#: (in channels, out channels, K, stride, padding, output padding, dilation, groups, bias)
GRID = [
    (4, 6, 16, 8, 4, 0, 1, 1, True),  # HiFi-GAN's first upsampling
    (4, 6, 5, 2, 1, 1, 1, 1, True),  # K not a multiple of s, output padding
    (4, 6, 3, 4, 1, 0, 1, 1, False),  # K < s
    (4, 6, 4, 2, 0, 1, 2, 1, True),  # dilation 2
    (4, 6, 3, 1, 1, 0, 1, 1, True),  # stride 1
    (4, 6, 3, 1, 3, 0, 1, 2, True),  # stride 1, padding past the kernel: a crop
    (4, 6, 7, 3, 2, 2, 1, 2, True),  # groups
    (6, 6, 4, 2, 1, 0, 1, 6, False),  # depthwise
]


class Grid(nn.Module):
    def __init__(self, cases):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.ConvTranspose1d(ci, co, k, s, p, op, g, b, d)
            for ci, co, k, s, p, op, d, g, b in cases
        )
        self.channels = [case[0] for case in cases]

    def forward(self, x):
        return tuple(conv(x[:, :c]) for conv, c in zip(self.convs, self.channels, strict=True))


def _leftover(edge) -> list[str]:
    gm = edge.exported_program().graph_module
    return [
        str(n.target)
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is not torch.ops.higher_order.executorch_call_delegate
        and "getitem" not in str(n.target)
    ]


class KeepConvTranspose(Partitioner):
    """Takes nothing but keeps ``aten.conv_transpose1d`` whole: the form
    RustConv meets when another partitioner of the list keeps it."""

    def partition(self, exported_program):
        return PartitionResult(tagged_exported_program=exported_program, partition_tags={})

    def ops_to_not_decompose(self, ep):
        return [torch.ops.aten.conv_transpose1d.default], None


@pytest.mark.parametrize("flow", ["to_edge", "transform", "transform+keep"])
def test_a_grid_of_transposed_convs_matches_eager_in_both_runtimes(flow, tmp_path):
    model = Grid(GRID).eval()
    x = torch.randn(2, 6, 11, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(x)
    ep = export(model, (x,))
    if flow == "to_edge":
        edge = to_edge(ep).to_backend(RustConvPartitioner())
    elif flow == "transform":
        edge = to_edge_transform_and_lower(ep, partitioner=[RustConvPartitioner()])
    else:
        partitioners = [RustConvPartitioner(), KeepConvTranspose()]
        edge = to_edge_transform_and_lower(ep, partitioner=partitioners)
        (lm, *_) = lowered_modules(edge)
        targets = {str(n.target) for n in lm.original_module.graph.nodes}
        assert any("conv_transpose1d" in t for t in targets), targets
    assert _leftover(edge) == []  # the slices of x too: every op is RustConv's
    program = edge.to_executorch()
    assert set(delegate_backends(program)) == {"RustConvBackend"}
    assert not program.executorch_program.execution_plan[0].operators
    pte = save(program, tmp_path)
    for got, w, case in zip(run_runtime(pte, [x]), want, GRID, strict=True):
        assert_close(got, w, f"runtime {case}")
    for got, w, case in zip(run_pte_runner(pte, [x], tmp_path), want, GRID, strict=True):
        assert_close(got, w, f"pte_runner {case}")


def test_phase_weights_cover_every_tap_once():
    """Every tap of W lands once in the phase weight, the rest is zero: the
    stride-1 conv of the phases does the work of the transposed conv."""
    gen = torch.Generator().manual_seed(1)
    for ci, co, k, s, _, _, d, g, _ in GRID:
        w = torch.randn(ci, co // g, k, generator=gen)
        wc, _ = phase_weight(w, None, s, d, g)
        assert wc.shape == (co * s, ci // g, d * (k - 1) // s + 1)
        assert torch.equal(wc[wc != 0].sort().values, w.flatten().sort().values)


class UpsampleBlock(nn.Module):
    """HiFi-GAN's upsampling stage: ConvTranspose1d(k=16, s=8, p=4), LeakyReLU,
    a residual conv (weight-normalised, as HiFi-GAN trains it)."""

    def __init__(self, channels=16):
        super().__init__()
        self.up = nn.utils.parametrizations.weight_norm(
            nn.ConvTranspose1d(2 * channels, channels, 16, 8, padding=4)
        )
        self.conv = nn.utils.parametrizations.weight_norm(
            nn.Conv1d(channels, channels, 3, padding=1)
        )

    def forward(self, x):
        x = self.up(F.leaky_relu(x, 0.1))
        return x + self.conv(F.leaky_relu(x, 0.1))


def test_a_hifigan_upsampling_block_is_one_rustconv_call_beside_xnnpack(tmp_path):
    model = UpsampleBlock().eval()
    x = torch.randn(1, 32, 20, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(x)
    edge = to_edge_transform_and_lower(
        export(model, (x,)), partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
    )
    assert _leftover(edge) == []
    program = edge.to_executorch()
    assert delegate_backends(program) == ["RustConvBackend"]
    pte = save(program, tmp_path)
    assert_close(run_runtime(pte, [x])[0], want, "runtime")
    assert_close(run_pte_runner(pte, [x], tmp_path)[0], want, "pte_runner")
    # The conv of the phases, two copies interleaving them, the permute
    # between them, and the block's tail: the slice, LeakyReLU and the
    # residual conv's prologue and epilogue.
    (lm,) = lowered_modules(edge)
    assert len({node.kernel for node in blob_graph(lm).nodes}) == 5


def test_the_blob_holds_the_phase_weights_not_the_original_ones(tmp_path):
    conv = nn.ConvTranspose1d(8, 4, 5, 2, padding=1).eval()
    x = torch.randn(1, 8, 9)
    edge = to_edge(export(conv, (x,))).to_backend(RustConvPartitioner())
    buffer = edge.to_executorch().buffer
    wc, bc = phase_weight(conv.weight.detach(), conv.bias.detach(), 2, 1, 1)
    assert wc.numpy().tobytes() in buffer
    assert conv.weight.detach().numpy().tobytes() not in buffer
    (lm,) = lowered_modules(edge)
    constants = [v for v in blob_graph(lm).values if v.kind == ValueKind.Constant]
    assert sorted(v.constantSize for v in constants) == sorted([wc.numel() * 4, bc.numel() * 4])


def test_a_dynamic_length_runs_at_every_length(tmp_path):
    conv = nn.ConvTranspose1d(4, 3, 7, 3, padding=2, output_padding=1).eval()
    x = torch.randn(1, 4, 12)
    ep = export(conv, (x,), dynamic_shapes=({2: Dim("t", min=2, max=64)},))
    program = to_edge(ep).to_backend(RustConvPartitioner()).to_executorch()
    assert delegate_backends(program) == ["RustConvBackend"]
    pte = save(program, tmp_path)
    for length in (2, 12, 31, 64):
        xs = torch.randn(1, 4, length)
        with torch.no_grad():
            want = conv(xs)
        assert_close(run_runtime(pte, [xs])[0], want, f"runtime T={length}")
        assert_close(run_pte_runner(pte, [xs], tmp_path)[0], want, f"pte_runner T={length}")


def test_float16_stays_float16(tmp_path):
    conv = nn.ConvTranspose1d(8, 4, 5, 2, padding=1, output_padding=1).half().eval()
    x = torch.randn(1, 8, 9, generator=torch.Generator().manual_seed(3)).half()
    program = to_edge(export(conv, (x,))).to_backend(RustConvPartitioner()).to_executorch()
    assert delegate_backends(program) == ["RustConvBackend"]
    got = run_runtime(save(program, tmp_path), [x])[0]
    with torch.no_grad():
        want = conv.float()(x.float())
    assert got.dtype == torch.float16
    assert_close(got.float(), want, "float16", atol=2e-3 * float(want.abs().max()))


class FedWeight(nn.Module):
    def forward(self, x, w):
        return F.conv_transpose1d(x, w, stride=2)


def test_what_is_refused_says_why():
    x, w = torch.randn(1, 4, 8), torch.randn(4, 3, 4)
    reasons = RustConvPartitioner().explain(to_edge(export(FedWeight(), (x, w))).exported_program())
    (reason,) = [r for name, r in reasons.items() if "convolution" in name]
    assert "not a constant" in reason and "phase weights at export" in reason

    conv = nn.ConvTranspose1d(4, 3, 4, 2).eval()
    ep = export(conv, (torch.randn(2, 4, 8),), dynamic_shapes=({0: Dim("b", max=8)},))
    reasons = RustConvPartitioner().explain(to_edge(ep).exported_program())
    (reason,) = [r for name, r in reasons.items() if "convolution" in name]
    assert "batch size is dynamic" in reason
