"""The whole runtime on aarch64: pte_runner and the delegate built for
aarch64-unknown-linux-gnu against ExecuTorch's aarch64 wheel
(scripts/build_aarch64.sh), run under qemu-aarch64 on programs exported here,
against eager PyTorch. Every run's plan log must show the NEON kernels.

Runs when ``RUSTCONV_AARCH64_PTE_RUNNER`` names that binary (scripts/test.sh
sets it after building it); skipped otherwise. Emulated: nothing here is a
timing.
"""

import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_close, assert_delegated, delegate_backends, input_sets, save
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from test_blocks import _atol, _eager, _model, _program
from test_conv1d import CONFIGS, ConvModel
from test_scan_and_models import ConvScan, Mixed, Scan
from torch.export import Dim, export

RUNNER = os.environ.get("RUSTCONV_AARCH64_PTE_RUNNER")
QEMU = ["qemu-aarch64-static", "-L", "/usr/aarch64-linux-gnu"]
NEON = "plan: vector instructions neon"

pytestmark = pytest.mark.skipif(
    not RUNNER, reason="RUSTCONV_AARCH64_PTE_RUNNER unset (scripts/build_aarch64.sh builds it)"
)


def run_aarch64(
    pte: Path, inputs, tmp_path: Path, *extra: str, runner=RUNNER, env=None
) -> list[np.ndarray]:
    """Runs the aarch64 pte_runner under QEMU; checks the plan used NEON."""
    in_npz, out_npz = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(in_npz, **{str(i): t.numpy() for i, t in enumerate(inputs)})
    run = subprocess.run(
        [*QEMU, str(runner), "-model_path", str(pte), "-inputs_npz_path", str(in_npz),
         "-output_npz_path", str(out_npz), *extra],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == 0, f"aarch64 pte_runner failed: {run.stderr[-2000:]}"
    assert NEON in run.stderr, f"no NEON plan line in:\n{run.stderr[-2000:]}"
    with np.load(out_npz) as outputs:
        return [outputs[str(i)] for i in range(len(outputs.files))]


class Grid(torch.nn.Module):
    """Every conv of the end-to-end grid (test_conv1d.CONFIGS) in one program:
    one emulated run instead of one per setting."""

    def __init__(self, models):
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, *xs):
        return tuple(m(x) for m, x in zip(self.models, xs, strict=True))


def test_conv_grid(tmp_path):
    torch.manual_seed(0)
    models = [ConvModel(cfg).eval() for cfg in CONFIGS]
    inputs = tuple(torch.randn(cfg.batch, cfg.c_in, cfg.n) for cfg in CONFIGS)
    grid = Grid(models).eval()
    program = to_edge(export(grid, inputs)).to_backend(RustConvPartitioner()).to_executorch()
    assert_delegated(program)
    got = run_aarch64(save(program, tmp_path), inputs, tmp_path)
    with torch.no_grad():
        want = grid(*inputs)
    for cfg, g, w in zip(CONFIGS, got, want, strict=True):
        assert_close(g, w, str(cfg))


def test_scans(tmp_path):
    shapes = [(1, 8, 64), (2, 5, 257), (1, 3, 2048)]

    class Scans(torch.nn.Module):
        def forward(self, *args):
            return tuple(Scan()(*args[i : i + 3]) for i in range(0, len(args), 3))

    inputs = []
    gen = torch.Generator().manual_seed(1)
    for b, c, n in shapes:
        a = torch.tanh(torch.randn(b, c, n, generator=gen))
        inputs += [torch.randn(b, c, generator=gen), a, torch.randn(b, c, n, generator=gen)]
    inputs = tuple(inputs)
    program = to_edge(export(Scans(), inputs)).to_backend(RustConvPartitioner()).to_executorch()
    assert_delegated(program)
    got = run_aarch64(save(program, tmp_path), inputs, tmp_path)
    for shape, g, w in zip(shapes, got, Scans()(*inputs), strict=True):
        assert_close(g, w, f"scan {shape}", 1e-4 * max(1.0, w.abs().max().item()))


@pytest.mark.parametrize("k,algorithm", [(4, "auto"), (32, "fft")])
def test_float16(k, algorithm, tmp_path):
    from rustconv.compile_specs import algorithm as algorithm_spec

    torch.manual_seed(3)
    model = ConvScan(channels=8, k=k).eval()
    inputs = (torch.randn(1, 8, 96).half(), torch.rand(1, 8, 96).half(), torch.randn(1, 8).half())
    half_model = ConvScan(channels=8, k=k).eval().half()
    half_model.load_state_dict(model.half().state_dict())
    partitioner = RustConvPartitioner(compile_specs=[algorithm_spec(algorithm)])
    program = to_edge(export(half_model, inputs)).to_backend(partitioner).to_executorch()
    assert_delegated(program)
    got = run_aarch64(save(program, tmp_path), inputs, tmp_path)[0]
    assert got.dtype == np.float16
    # The float32 computation on the same float16 values, rounded once (as
    # the host test): the result's one float16 rounding is the tolerance.
    ref = ConvScan(channels=8, k=k).eval()
    ref.load_state_dict({n: v.float() for n, v in half_model.state_dict().items()})
    want = ref(*(t.float() for t in inputs)).half().float()
    assert_close(got.astype("float32"), want, "fp16", 1e-3 * max(1.0, want.abs().max().item()))


def test_dynamic_length(tmp_path):
    model = ConvScan().eval()
    seq = Dim("seq", min=2, max=256)
    example = (torch.randn(1, 8, 64), torch.rand(1, 8, 64), torch.randn(1, 8))
    ep = export(model, example, dynamic_shapes=({2: seq}, {2: seq}, None))
    program = to_edge(ep).to_backend(RustConvPartitioner()).to_executorch()
    assert_delegated(program)
    pte = save(program, tmp_path)
    for n in (2, 100, 256):
        inputs = (torch.randn(1, 8, n), torch.rand(1, 8, n), torch.randn(1, 8))
        assert_close(run_aarch64(pte, inputs, tmp_path)[0], model(*inputs), f"n={n}")


def test_mixed_model_with_xnnpack(tmp_path):
    model = Mixed().eval()
    inputs = (torch.randn(1, 32, 16), torch.rand(1, 8, 32), torch.randn(1, 8))
    program = to_edge_transform_and_lower(
        export(model, inputs), partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
    ).to_executorch()
    assert "XnnpackBackend" in delegate_backends(program)
    assert_delegated(program)
    got = run_aarch64(save(program, tmp_path), inputs, tmp_path, "-num_threads", "2")[0]
    assert_close(got, model(*inputs), "mixed")


@pytest.mark.parametrize("name", ["lfm2_hf_core", "diagonal_ssm"])
def test_fused_block(name, tmp_path):
    model = _model(name)
    example = model.make_inputs()
    program = _program(model, example, "transform")
    assert delegate_backends(program).count("RustConvBackend") == 1, delegate_backends(program)
    inputs = input_sets(*(t.shape for t in example))["random"]
    got = run_aarch64(save(program, tmp_path), inputs, tmp_path)[0]
    want = _eager(model, inputs)
    assert_close(got, want, name, _atol(want))


WHEEL = os.environ.get("RUSTCONV_AARCH64_WHEEL")
EXECUTORCH_DIR = os.environ.get("RUSTCONV_AARCH64_EXECUTORCH_DIR")


@pytest.mark.skipif(not (WHEEL and EXECUTORCH_DIR), reason="no aarch64 wheel built")
def test_the_aarch64_wheel_runs_where_it_is_installed(tmp_path):
    """The wheel's pte_runner, unpacked into a site-packages beside the
    aarch64 executorch package, finds ExecuTorch through its relative
    RUNPATH alone (no LD_LIBRARY_PATH; QEMU's -L only supplies glibc)."""
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(site)
    (site / "executorch").symlink_to(EXECUTORCH_DIR, target_is_directory=True)
    runner = site / "rustconv" / "bin" / "pte_runner"
    runner.chmod(0o755)
    model = ConvScan().eval()
    inputs = (torch.randn(1, 8, 64), torch.rand(1, 8, 64), torch.randn(1, 8))
    program = to_edge(export(model, inputs)).to_backend(RustConvPartitioner()).to_executorch()
    pte = save(program, tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    got = run_aarch64(pte, inputs, tmp_path, runner=runner, env=env)[0]
    assert_close(got, model(*inputs), "installed aarch64 wheel")
