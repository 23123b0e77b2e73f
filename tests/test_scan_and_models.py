"""Linear scans, dynamic sequence length, and a mixed model lowered with
RustConvPartitioner and XnnpackPartitioner together."""

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_close,
    assert_delegated,
    delegate_backends,
    input_sets,
    run_pte_runner,
    run_runtime,
    save,
)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from torch.export import Dim, export


class Scan(torch.nn.Module):
    def forward(self, x0, a, u):
        return torch.ops.rustconv.linear_scan(x0, a, u)


@pytest.mark.parametrize("batch,channels,n", [(1, 1, 1), (1, 8, 64), (2, 5, 257), (1, 3, 2048)])
def test_scan_matches_eager(batch, channels, n, tmp_path):
    shapes = [(batch, channels), (batch, channels, n), (batch, channels, n)]
    example = tuple(torch.randn(s) for s in shapes)
    program = to_edge(export(Scan(), example)).to_backend(RustConvPartitioner()).to_executorch()
    assert_delegated(program)
    pte = save(program, tmp_path)
    sets = input_sets(*shapes)
    # A decay inside (-1, 1) keeps random scans bounded, as in real models.
    x0, a, u = sets["random"]
    sets["random"] = (x0, torch.tanh(a), u)
    for kind, inputs in sets.items():
        want = Scan()(*inputs)
        # all-ones inputs grow linearly to n: compare relative to that scale.
        atol = 1e-4 * max(1.0, want.abs().max().item())
        assert_close(run_runtime(pte, inputs)[0], want, f"runtime, {kind}", atol)
        assert_close(run_pte_runner(pte, inputs, tmp_path)[0], want, f"pte_runner, {kind}", atol)


class ConvScan(torch.nn.Module):
    """Causal depthwise conv feeding a scan whose decay is an input."""

    def __init__(self, channels=8, k=4):
        super().__init__()
        self.k = k
        self.conv = torch.nn.Conv1d(channels, channels, k, groups=channels)

    def forward(self, x, a, x0):
        u = self.conv(F.pad(x, (self.k - 1, 0)))
        return torch.ops.rustconv.linear_scan(x0, a, u)


def test_dynamic_sequence_length_runs_at_any_length_up_to_the_bound(tmp_path):
    model = ConvScan().eval()
    seq = Dim("seq", min=2, max=256)
    example = (torch.randn(1, 8, 64), torch.rand(1, 8, 64), torch.randn(1, 8))
    ep = export(model, example, dynamic_shapes=({2: seq}, {2: seq}, None))
    program = to_edge(ep).to_backend(RustConvPartitioner()).to_executorch()
    assert_delegated(program)
    pte = save(program, tmp_path)
    for n in (2, 17, 100, 256):
        inputs = (torch.randn(1, 8, n), torch.rand(1, 8, n), torch.randn(1, 8))
        want = model(*inputs)
        assert_close(run_runtime(pte, inputs)[0], want, f"runtime, n={n}")
        assert_close(run_pte_runner(pte, inputs, tmp_path)[0], want, f"pte_runner, n={n}")


def test_dynamic_length_beyond_the_bound_is_refused(tmp_path):
    model = ConvScan().eval()
    seq = Dim("seq", min=2, max=32)
    example = (torch.randn(1, 8, 16), torch.rand(1, 8, 16), torch.randn(1, 8))
    ep = export(model, example, dynamic_shapes=({2: seq}, {2: seq}, None))
    pte = save(to_edge(ep).to_backend(RustConvPartitioner()).to_executorch(), tmp_path)
    with pytest.raises(RuntimeError, match="set_inputs"):
        run_runtime(pte, (torch.randn(1, 8, 33), torch.rand(1, 8, 33), torch.randn(1, 8)))


class Mixed(torch.nn.Module):
    """Linear (XNNPACK) -> conv1d -> scan (RustConv)."""

    def __init__(self, d=16, c=8, k=3):
        super().__init__()
        self.linear = torch.nn.Linear(d, c)
        self.conv = torch.nn.Conv1d(c, c, k, padding=k // 2)

    def forward(self, x, a, x0):
        h = self.linear(x).transpose(1, 2)  # [B, N, D] -> [B, C, N]
        return torch.ops.rustconv.linear_scan(x0, a, self.conv(h))


def test_mixed_model_runs_with_both_delegates(tmp_path):
    model = Mixed().eval()
    inputs = (torch.randn(1, 32, 16), torch.rand(1, 8, 32), torch.randn(1, 8))
    program = to_edge_transform_and_lower(
        export(model, inputs), partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
    ).to_executorch()
    backends = delegate_backends(program)
    assert "XnnpackBackend" in backends, backends
    assert_delegated(program)
    pte = save(program, tmp_path)
    want = model(*inputs)
    assert_close(run_pte_runner(pte, inputs, tmp_path, "-num_threads", "2")[0], want, "pte_runner")
    assert_close(run_runtime(pte, inputs)[0], want, "runtime")


@pytest.mark.parametrize("k,algorithm", [(4, "auto"), (32, "fft")])
def test_float16_model_stays_float16_and_matches(k, algorithm, tmp_path):
    """model.half(): tensors stay float16, the delegate computes in float32.
    The reference is the float32 computation on the same float16 values,
    rounded to float16 once at the end (what the delegate does). With fft,
    the f32 copy of the weights is dropped after init (spectra replace it)."""
    from rustconv.compile_specs import algorithm as algorithm_spec

    torch.manual_seed(3)
    model = ConvScan(channels=8, k=k).eval()
    inputs32 = (torch.randn(1, 8, 96), torch.rand(1, 8, 96), torch.randn(1, 8))
    half_model = ConvScan(channels=8, k=k).eval().half()
    half_model.load_state_dict(model.half().state_dict())
    inputs = tuple(t.half() for t in inputs32)
    partitioner = RustConvPartitioner(compile_specs=[algorithm_spec(algorithm)])
    program = to_edge(export(half_model, inputs)).to_backend(partitioner).to_executorch()
    assert_delegated(program)
    pte = save(program, tmp_path)
    want = ConvScan(channels=8, k=k).eval()
    want.load_state_dict({k: v.float() for k, v in half_model.state_dict().items()})
    want = want(*(t.float() for t in inputs)).half()
    got = run_runtime(pte, inputs)[0]
    assert got.dtype == torch.float16
    # One float16 rounding of the result: half an ulp, about 5e-4 relative.
    atol = 1e-3 * max(1.0, want.abs().max().item())
    assert_close(got.float(), want.float(), "runtime", atol)
    assert_close(
        run_pte_runner(pte, inputs, tmp_path)[0].astype("float32"), want.float(), "pte_runner", atol
    )
