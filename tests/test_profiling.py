"""Profiling inside the delegate: an ETDump written by pte_runner holds one
RustConv event per fused kernel per iteration, which the Inspector shows
under the RustConv DELEGATE_CALL with the model's original ops (through the
ETRecord saved at export) and parseable metadata; the kernels' times add up
to the delegate call's own time."""

import statistics
import subprocess

import numpy as np
import pytest
import torch
from conftest import delegate_backends, pte_runner_path
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from rustconv import RustConvPartitioner, blocks
from rustconv.compile_specs import fusion
from rustconv.devtools.inspect import delegate_calls, plan_blob
from rustconv.devtools.profile import name_ops_from_plan
from rustconv.devtools.trace import (
    lower_with_etrecord,
    parse_delegate_metadata,
    read_profile,
)
from torch.export import export

ITERS = 4


def profile_block(model, inputs, tmp_path, partitioners, iters=ITERS, threads=None):
    pte, etrecord, etdump = (tmp_path / f for f in ("m.pte", "m.etrecord", "m.etdump"))
    program = lower_with_etrecord(export(model, inputs), partitioners, pte, etrecord)
    in_npz = tmp_path / "in.npz"
    np.savez(in_npz, **{str(i): t.numpy() for i, t in enumerate(inputs)})
    extra = [f"-num_threads={threads}"] if threads else []
    run = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte), "-inputs_npz_path", str(in_npz),
         "-iter", str(iters), "-etdump_path", str(etdump), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return program, etdump, etrecord


def test_parse_delegate_metadata():
    parsed = parse_delegate_metadata(
        [b"algorithm=fft;bytes=10;flops=20", b"algorithm=elementwise;bytes=7"]
    )
    assert parsed == {"algorithm": ["fft", "elementwise"], "bytes": [10, 7], "flops": [20, None]}


def test_lfm2_block_reports_its_fused_kernel_under_the_delegate_call(tmp_path):
    from executorch.devtools import Inspector

    torch.manual_seed(0)
    model = blocks.Lfm2ShortConvHF(32).eval()
    inputs = model.make_inputs(seq=64)
    program, etdump, etrecord = profile_block(
        model, inputs, tmp_path, [RustConvPartitioner(), XnnpackPartitioner()]
    )
    assert delegate_backends(program).count("RustConvBackend") == 1

    inspector = Inspector(
        etdump_path=str(etdump),
        etrecord=str(etrecord),
        delegate_metadata_parser=parse_delegate_metadata,
    )
    (block,) = [b for b in inspector.event_blocks if b.name == "Execute"]
    events = block.events
    rust = [e for e in events if e.is_delegated_op and e.delegate_backend_name == "RustConvBackend"]
    assert [e.name for e in rust] == ["0"], [e.name for e in events]
    (kernel,) = rust
    assert kernel.delegate_debug_identifier == 0
    assert len(kernel.perf_data.raw) == ITERS
    ops = set(kernel.op_types)
    assert {"aten.convolution.default", "aten.mul.Tensor", "aten.permute_copy.default"} <= ops
    assert not any("linear" in op or "addmm" in op or "mm" == op for op in ops), ops
    meta = kernel.delegate_debug_metadatas
    assert meta["algorithm"] == ["depthwise_simd"] * ITERS
    # [1, 64, 96] in, [1, 64, 32] out and the [32, 1, 3] taps, as f32.
    assert meta["bytes"] == [(64 * 96 + 64 * 32 + 32 * 3) * 4] * ITERS
    assert meta["flops"] == [2 * 32 * 64 * 3] * ITERS
    # Under its DELEGATE_CALL: the same instruction, listed right after it.
    at = events.index(kernel)
    call = events[at + 1]
    assert call.name == "DELEGATE_CALL" and call.delegate_backend_name == "RustConvBackend"
    assert call._instruction_id == kernel._instruction_id

    df = inspector.to_dataframe(include_delegate_debug_data=True)
    row = df[(df.event_name == "0") & (df.delegate_backend_name == "RustConvBackend")]
    assert len(row) == 1 and bool(row.is_delegated_op.iloc[0])
    assert list(row.algorithm.iloc[0]) == ["depthwise_simd"] * ITERS


def test_unfused_ssm_reports_every_kernel_and_they_add_up_to_the_call(tmp_path):
    # Fusion off: one kernel per op, each timed; a large input so the call's
    # own overhead (argument checks, shapes) is small next to the kernels.
    torch.manual_seed(0)
    model = blocks.DiagonalSSM(512).eval()
    inputs = model.make_inputs(seq=4096)
    program, etdump, etrecord = profile_block(
        model, inputs, tmp_path, [RustConvPartitioner(compile_specs=[fusion(False)])], iters=5
    )
    assert delegate_backends(program) == ["RustConvBackend"]
    profile = read_profile(etdump, etrecord)
    (call,) = profile.calls
    names = [k.op_types for k in call.kernels]
    assert len(call.kernels) >= 8, names
    assert [k.kernel for k in call.kernels] == list(range(len(call.kernels)))
    assert all(len(k.times_ms) == 5 for k in call.kernels)
    scan = [k for k in call.kernels if k.op_types == ["rustconv.linear_scan.default"]]
    assert len(scan) == 1 and scan[0].flops[0] == 2 * 512 * 4096
    assert any("aten.exp.default" in k.op_types for k in call.kernels)
    ratios = [sum(k.times_ms[i] for k in call.kernels) / call.times_ms[i] for i in range(5)]
    assert 0.9 <= statistics.median(ratios) <= 1.0 + 1e-6, ratios


@pytest.mark.parametrize("fused", [True, False])
def test_kernel_count_follows_fusion(tmp_path, fused):
    torch.manual_seed(0)
    model = blocks.DiagonalSSM(16).eval()
    inputs = model.make_inputs(seq=32)
    specs = [] if fused else [fusion(False)]
    program, etdump, etrecord = profile_block(
        model, inputs, tmp_path, [RustConvPartitioner(compile_specs=specs)], iters=2
    )
    (call,) = read_profile(etdump, etrecord).calls
    ops = {op for k in call.kernels for op in k.op_types}
    assert {"rustconv.linear_scan.default", "aten.exp.default"} <= ops, ops
    # One event per kernel of the runtime's own plan, with its algorithm.
    (blob,) = delegate_calls(program.buffer)
    plan = plan_blob(blob.blob, blob.compile_specs)
    assert [(k.kernel, k.algorithm) for k in call.kernels] == [
        (k["kernel"], k["algorithm"]) for k in plan["kernels"]
    ]
    assert (len(call.kernels) == 1) == fused


def test_without_an_etrecord_kernels_are_named_from_the_program(tmp_path):
    """A trace read without the ETRecord (the Inspector then names no backend
    and no ops) still finds our kernels, their algorithms and their ops."""
    torch.manual_seed(0)
    model = blocks.DiagonalSSM(16).eval()
    inputs = model.make_inputs(seq=32)
    program, etdump, _ = profile_block(
        model, inputs, tmp_path, [RustConvPartitioner(compile_specs=[fusion(False)])], iters=2
    )
    profile = read_profile(etdump)
    (call,) = profile.calls
    assert call.backend == "RustConvBackend" and len(call.kernels) > 1
    assert all(k.algorithm for k in call.kernels)
    assert not any(k.op_types for k in call.kernels)
    name_ops_from_plan(profile, program.buffer)
    ops = [op for k in call.kernels for op in k.op_types]
    assert "linear_scan" in ops and "exp" in ops, ops


KERNEL_FIELDS = {
    "kind", "call", "backend", "kernel", "name", "algorithm", "op_types", "median_ms", "mean_ms",
    "p90_ms",
    "share", "iterations", "times_ms", "bytes", "flops", "gbps", "gflops", "copy_fraction",
}  # fmt: skip


def test_profile_command_reports_kernels_beside_other_work(tmp_path):
    import json
    import os
    import sys

    from conftest import ROOT

    # RustConv only: the projections run as ExecuTorch's CPU kernels, beside it.
    torch.manual_seed(0)
    model = blocks.Lfm2ShortConvHF(64).eval()
    inputs = model.make_inputs(seq=256)
    pte, etrecord = tmp_path / "m.pte", tmp_path / "m.etrecord"
    lower_with_etrecord(export(model, inputs), [RustConvPartitioner()], pte, etrecord)
    in_npz = tmp_path / "in.npz"
    np.savez(in_npz, **{str(i): t.numpy() for i, t in enumerate(inputs)})
    out_json, out_png, etdump = tmp_path / "p.json", tmp_path / "p.png", tmp_path / "p.etdump"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "partitioner_py"),
           "PTE_RUNNER": str(pte_runner_path())}  # fmt: skip
    cmd = [sys.executable, "-m", "rustconv.profile", str(pte), "--inputs", str(in_npz),
           "--iter", "6", "--threads", "2", "--etrecord", str(etrecord), "--etdump", str(etdump),
           "--json", str(out_json), "--png", str(out_png)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "kernel 0" in run.stdout and "depthwise_simd" in run.stdout, run.stdout
    assert "copy bandwidth" in run.stdout

    doc = json.loads(out_json.read_text())
    assert doc["method"]["iterations"] == 6  # the warm-up iterations are dropped
    assert doc["method"]["median_ms"] > 0 and doc["copy_bandwidth_gbps"] > 0
    kinds = [r["kind"] for r in doc["rows"]]
    assert kinds.count("delegate_call") == 1 and kinds.count("kernel") == 1
    assert kinds.count("operator") >= 2, kinds  # the two linears, at least
    (kernel,) = [r for r in doc["rows"] if r["kind"] == "kernel"]
    assert set(kernel) == KERNEL_FIELDS
    assert kernel["algorithm"] == "depthwise_simd" and kernel["iterations"] == 6
    assert kernel["bytes"] == (256 * 192 + 256 * 64 + 64 * 3) * 4
    assert kernel["flops"] == 2 * 64 * 256 * 3
    seconds = kernel["median_ms"] / 1e3
    assert kernel["gbps"] == pytest.approx(kernel["bytes"] / seconds / 1e9)
    assert kernel["copy_fraction"] == pytest.approx(kernel["gbps"] / doc["copy_bandwidth_gbps"])
    assert kernel["gflops"] == pytest.approx(kernel["flops"] / seconds / 1e9)
    assert kernel["share"] == pytest.approx(kernel["median_ms"] / doc["method"]["median_ms"])
    assert kernel["p90_ms"] >= kernel["median_ms"]
    assert any("conv" in op for op in kernel["op_types"]), kernel["op_types"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # An ETDump made elsewhere is read, not re-run: every iteration kept.
    again = subprocess.run(cmd[:-4] + ["--json", str(out_json)], capture_output=True,
                           text=True, timeout=300, env=env)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(out_json.read_text())["method"]["iterations"] == 6 + 2


def test_report_puts_other_delegates_beside_the_kernels(tmp_path):
    from rustconv.devtools.profile import report

    torch.manual_seed(0)
    model = blocks.Lfm2ShortConvHF(32).eval()
    _, etdump, etrecord = profile_block(
        model, model.make_inputs(seq=64), tmp_path, [RustConvPartitioner(), XnnpackPartitioner()]
    )
    doc = report(read_profile(etdump, etrecord), copy_gbps=10.0)
    calls = [(r["backend"], r["call"]) for r in doc["rows"] if r["kind"] == "delegate_call"]
    assert calls == [("XnnpackBackend", 0), ("RustConvBackend", 1), ("XnnpackBackend", 2)]
    xnn_ops = [r for r in doc["rows"] if r["kind"] == "delegated_op"]
    assert len(xnn_ops) == 2 and all(r["backend"] == "XnnpackBackend" for r in xnn_ops)
    assert [r["call"] for r in doc["rows"] if r["kind"] == "kernel"] == [1]
