"""A linear scan that no delegate takes still exports and runs: through the
``rustconv::linear_scan.out`` out variant (rustconv/ops.py) and its ExecuTorch
kernel (delegate/cpp/scan_kernel.cpp), registered by ``import rustconv.runtime``
and linked into pte_runner."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    assert_close,
    assert_delegated,
    delegate_backends,
    pte_runner_path,
    run_pte_runner,
    run_runtime,
    save,
)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from torch.export import Dim, export

OUT_OP = "rustconv::linear_scan.out"


class Scan(torch.nn.Module):
    def forward(self, x0, a, u):
        return torch.ops.rustconv.linear_scan(x0, a, u)


class LinearScan(torch.nn.Module):
    """Linear (XNNPACK takes it) feeding the scan's input u."""

    def __init__(self, d=16, c=8):
        super().__init__()
        self.linear = torch.nn.Linear(d, c)

    def forward(self, x, a, x0):
        u = self.linear(x).transpose(1, 2)  # [B, N, D] -> [B, C, N]
        return torch.ops.rustconv.linear_scan(x0, a, u)


def operators(program) -> list[str]:
    """Operators the program runs outside delegates, as "name.overload"."""
    plan = program.executorch_program.execution_plan[0]
    return [f"{op.name}.{op.overload}" for op in plan.operators]


def assert_scan_runs_as_operator(program):
    assert OUT_OP in operators(program), operators(program)
    assert "RustConvBackend" not in delegate_backends(program)


def scan_inputs(b, c, n, dtype=torch.float32, seed=0):
    """x0, a, u with a decay inside (-1, 1), so scans stay bounded."""
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(b, c, generator=gen)
    a = torch.rand(b, c, n, generator=gen) * 1.8 - 0.9
    u = torch.randn(b, c, n, generator=gen)
    return tuple(t.to(dtype) for t in (x0, a, u))


def test_out_variant_is_what_to_executorch_finds():
    from executorch.exir.operator.convert import to_out_variant

    out_op, out_args = to_out_variant(torch.ops.rustconv.linear_scan.default)
    assert out_op is torch.ops.rustconv.linear_scan.out and out_args == ("out",)


def test_eager_out_variant_resizes_out_and_matches_the_functional_op():
    x0, a, u = scan_inputs(2, 3, 17)
    out = torch.empty(0)
    result = torch.ops.rustconv.linear_scan.out(x0, a, u, out=out)
    assert result is out and out.shape == a.shape
    assert torch.equal(out, torch.ops.rustconv.linear_scan(x0, a, u))
    with pytest.raises(TypeError, match="dtype"):
        torch.ops.rustconv.linear_scan.out(x0, a, u, out=torch.empty(0, dtype=torch.float64))
    with pytest.raises(ValueError, match="same shape"):
        torch.ops.rustconv.linear_scan.out(x0, a, u[..., :-1], out=out)


def test_xnnpack_only_model_runs_the_scan_kernel(tmp_path):
    torch.manual_seed(0)
    model = LinearScan().eval()
    x0, a, _ = scan_inputs(1, 8, 48)
    inputs = (torch.randn(1, 48, 16), a, x0)
    program = to_edge_transform_and_lower(
        export(model, inputs), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    assert "XnnpackBackend" in delegate_backends(program), delegate_backends(program)
    assert_scan_runs_as_operator(program)
    pte = save(program, tmp_path)
    want = model(*inputs)
    assert_close(run_runtime(pte, inputs)[0], want, "runtime")
    assert_close(run_pte_runner(pte, inputs, tmp_path)[0], want, "pte_runner")


@pytest.mark.parametrize("batch,channels,n", [(1, 1, 1), (2, 5, 257)])
def test_float64_scan_is_not_delegated_and_runs(batch, channels, n, tmp_path):
    inputs = scan_inputs(batch, channels, n, torch.float64)
    # Even with RustConv's partitioner: it delegates fp32 and fp16 only.
    program = to_edge(export(Scan(), inputs)).to_backend(RustConvPartitioner()).to_executorch()
    assert_scan_runs_as_operator(program)
    pte = save(program, tmp_path)
    want = Scan()(*inputs)
    got = run_runtime(pte, inputs)[0]
    assert got.dtype == torch.float64
    assert_close(got, want, "runtime", atol=1e-12)
    got = run_pte_runner(pte, inputs, tmp_path)[0]
    assert got.dtype == np.float64
    assert_close(got, want, "pte_runner", atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_scan_computes_in_float32(dtype, tmp_path):
    """The state is carried in float32 and each output rounded once, like the
    delegate: the reference is the float32 scan of the same values, rounded."""
    inputs = scan_inputs(2, 4, 96, dtype)
    program = to_edge_transform_and_lower(
        export(Scan(), inputs), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    assert_scan_runs_as_operator(program)
    pte = save(program, tmp_path)
    want = Scan()(*(t.float() for t in inputs)).to(dtype).float()
    # One rounding: half an ulp, 2^-11 (fp16) or 2^-8 (bf16) relative.
    rel = 1e-3 if dtype == torch.float16 else 8e-3
    atol = rel * max(1.0, want.abs().max().item())
    got = run_runtime(pte, inputs)[0]
    assert got.dtype == dtype
    assert_close(got.float(), want, "runtime", atol)
    if dtype == torch.float16:  # numpy has no bfloat16 for the npz files
        got = run_pte_runner(pte, inputs, tmp_path)[0]
        assert got.dtype == np.float16
        assert_close(got.astype(np.float32), want, "pte_runner", atol)


def dynamic_scan_program(max_n=256):
    seq = Dim("seq", min=1, max=max_n)
    example = scan_inputs(1, 4, 32)
    ep = export(Scan(), example, dynamic_shapes=(None, {2: seq}, {2: seq}))
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()


@pytest.fixture(scope="module")
def dynamic_pte(tmp_path_factory):
    program = dynamic_scan_program()
    assert_scan_runs_as_operator(program)
    return save(program, tmp_path_factory.mktemp("dynamic"))


def test_dynamic_sequence_length(dynamic_pte, tmp_path):
    for n in (1, 17, 100, 256):
        inputs = scan_inputs(1, 4, n, seed=n)
        want = Scan()(*inputs)
        assert_close(run_runtime(dynamic_pte, inputs)[0], want, f"runtime, n={n}")
        got = run_pte_runner(dynamic_pte, inputs, tmp_path)[0]
        assert_close(got, want, f"pte_runner, n={n}")


def test_mismatched_lengths_fail_the_kernel_without_a_crash(dynamic_pte, tmp_path, capfd):
    """a and u share the dynamic length, but set_inputs checks each only
    against its bound: the kernel is what refuses a: n=8 with u: n=9."""
    x0, a, _ = scan_inputs(1, 4, 8)
    u = torch.randn(1, 4, 9)
    with pytest.raises(RuntimeError, match="execute"):
        run_runtime(dynamic_pte, (x0, a, u))
    assert "a and u must have the same shape" in capfd.readouterr().err
    # The method still works after the failed call.
    inputs = scan_inputs(1, 4, 8)
    assert_close(run_runtime(dynamic_pte, inputs)[0], Scan()(*inputs), "runtime after failure")

    in_npz = tmp_path / "in.npz"
    np.savez(in_npz, **{str(i): t.numpy() for i, t in enumerate((x0, a, u))})
    run = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(dynamic_pte), "-inputs_npz_path", str(in_npz)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr  # an error exit, not a signal
    assert "a and u must have the same shape" in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("pte_runner: error: "), run.stderr


def test_rustconv_partitioner_still_delegates_the_scan(tmp_path):
    inputs = scan_inputs(1, 8, 64)
    program = to_edge(export(Scan(), inputs)).to_backend(RustConvPartitioner()).to_executorch()
    assert_delegated(program)
    assert OUT_OP not in operators(program)
    pte = save(program, tmp_path)
    assert_close(run_runtime(pte, inputs)[0], Scan()(*inputs), "runtime")


_SECOND_COPY = """
import ctypes, sys
import torch
sys.path.insert(0, sys.argv[1])
import rustconv, rustconv.runtime
from executorch.runtime import Runtime
# A second copy of the library: its backend registration is refused, its
# kernel registration finds the name taken and keeps the first kernel.
ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
assert rustconv.runtime.has_scan_kernel()
method = Runtime.get().load_program(sys.argv[3]).load_method("forward")
x0, a, u = torch.randn(1, 4), torch.rand(1, 4, 5), torch.randn(1, 4, 5)
got = method.execute([x0, a, u])[0]
assert torch.allclose(got, torch.ops.rustconv.linear_scan(x0, a, u), atol=1e-5)
print("ok")
"""


def test_second_copy_of_the_library_does_not_register_the_kernel_twice(dynamic_pte, tmp_path):
    import shutil

    import rustconv.runtime

    assert rustconv.runtime.has_scan_kernel()
    library = rustconv.runtime.library_path()
    if library is None:
        pytest.skip("the backend was linked some other way; no library to copy")
    copy = tmp_path / "librustconv_backend_copy.so"
    shutil.copy(library, copy)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, "-c", _SECOND_COPY, str(ROOT / "partitioner_py"), str(copy),
         str(dynamic_pte)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
    assert "already registered; keeping that kernel" in run.stderr, run.stderr[-3000:]


def test_pte_runner_with_the_library_preloaded_uses_one_kernel(dynamic_pte, tmp_path):
    """Both copies in one process: librustconv_backend.so (preloaded, so it
    registers first) and pte_runner's own. pte_runner's registrations are
    refused or skipped, and the library's backend and kernel serve."""
    import rustconv.runtime

    library = rustconv.runtime.library_path()
    if library is None:
        pytest.skip("the backend was linked some other way; no library to preload")
    inputs = scan_inputs(1, 4, 33)
    in_npz, out_npz = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(in_npz, **{str(i): t.numpy() for i, t in enumerate(inputs)})
    env = {**os.environ, "LD_PRELOAD": str(library.resolve())}
    run = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(dynamic_pte), "-inputs_npz_path", str(in_npz),
         "-output_npz_path", str(out_npz)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "already registered; keeping that kernel" in run.stderr, run.stderr[-3000:]
    with np.load(out_npz) as outputs:
        assert_close(outputs["0"], Scan()(*inputs), "pte_runner, preloaded")
