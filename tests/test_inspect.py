"""``python -m rustconv.inspect``: the runtime's plan for every delegate call,
and the memory planner's bound on the arena."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import rustconv.runtime  # noqa: F401  (the plan comes from the Rust library)
import torch
from executorch.exir import to_edge
from rustconv import RustConvPartitioner
from rustconv.compile_specs import CONV1D_ALGORITHMS, algorithm, fusion
from rustconv.devtools.inspect import delegate_calls, plan_blob
from rustconv.examples.blocks import ConvStack, DiagonalSSM, Lfm2ShortConvHFCore
from torch.export import export

ARENA_ALIGNMENT = 64


def lowered(model, inputs, compile_specs=None) -> bytes:
    ep = export(model.eval(), inputs)
    return to_edge(ep).to_backend(RustConvPartitioner(compile_specs)).to_executorch().buffer


@pytest.fixture(scope="module")
def lfm2_pte(tmp_path_factory) -> bytes:
    model = Lfm2ShortConvHFCore(32)
    return lowered(model, model.make_inputs(seq=64))


def test_cli_lists_fused_kernels_and_their_ops(lfm2_pte, tmp_path):
    path = tmp_path / "lfm2.pte"
    path.write_bytes(lfm2_pte)
    cmd = [sys.executable, "-m", "rustconv.inspect", str(path)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "RustConvBackend call 0: 1 fused kernel(s), arena 0 B" in text
    assert "depthwise_simd (prologue in its loops, epilogue in its loops)" in text
    assert "conv1d" in text and "permute" in text

    doc = json.loads(
        subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True).stdout
    )
    (call,) = doc
    kernels = call["plan"]["kernels"]
    assert len(kernels) == 1
    ops = [op["op"] for op in kernels[0]["absorbed"]]
    assert ops.count("conv1d") == 1 and ops.count("mul") == 2
    assert all(op["debug_handles"] for op in kernels[0]["absorbed"])


def _max_live_bytes(plan) -> int:
    """The most arena bytes (each buffer 64-byte aligned) alive at one kernel."""
    stored = [v for v in plan["values"] if v["location"] == "arena"]
    steps = len(plan["kernels"])
    live = [
        sum(
            -(-v["bytes"] // ARENA_ALIGNMENT) * ARENA_ALIGNMENT
            for v in stored
            if v["lifetime"][0] <= s <= v["lifetime"][1]
        )
        for s in range(steps)
    ]
    return max(live, default=0)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_arena_holds_no_more_than_the_largest_set_alive_at_once(fused):
    model = DiagonalSSM(16)
    pte = lowered(model, model.make_inputs(seq=256), None if fused else [fusion(False)])
    (call,) = delegate_calls(pte)
    plan = plan_blob(call.blob, call.compile_specs)
    assert plan["arena_bytes"] <= _max_live_bytes(plan)
    if fused:
        # Everything between the inputs and the output stays in registers.
        assert plan["arena_bytes"] == 0 and len(plan["kernels"]) == 1
    else:
        assert len(plan["kernels"]) == 12
        # Far less than one buffer per intermediate.
        total = sum(v["bytes"] for v in plan["values"] if v["location"] == "arena")
        assert 0 < plan["arena_bytes"] < total / 2


def test_fft_gemm_layers_share_one_layers_packed_weights(tmp_path):
    """fft_gemm reads its weights in place and packs them per call into scratch
    the stack's convs share: one layer's weights, not twelve."""
    c, k, layers = 24, 5, 12
    model = ConvStack(c, k, layers)
    pte = lowered(model, model.make_inputs(seq=256), [algorithm("fft_gemm")])
    (call,) = delegate_calls(pte)
    plan = plan_blob(call.blob, call.compile_specs)
    assert [kernel["algorithm"] for kernel in plan["kernels"]] == ["fft_gemm"] * layers
    one_layer = 4 * c * c * k
    assert one_layer <= plan["shared_scratch_bytes"] < 2 * one_layer
    path = tmp_path / "stack.pte"
    path.write_bytes(pte)
    cmd = [sys.executable, "-m", "rustconv.inspect", str(path)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert " shared" in text.splitlines()[0], text


def test_a_corrupt_blob_is_refused_with_the_runtime_reason(lfm2_pte):
    (call,) = delegate_calls(lfm2_pte)
    with pytest.raises(ValueError, match="blob"):
        plan_blob(call.blob[:40])
    with pytest.raises(ValueError, match="num_threads"):
        plan_blob(call.blob, [("num_threads", b"\0\0\0\0")])


def test_program_without_rustconv_calls(tmp_path):
    path = tmp_path / "plain.pte"
    model = torch.nn.Linear(4, 4)
    path.write_bytes(to_edge(export(model, (torch.randn(2, 4),))).to_executorch().buffer)
    cmd = [sys.executable, "-m", "rustconv.inspect", str(path)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "no RustConvBackend delegate calls" in text


def test_export_knows_the_runtime_conv_algorithms():
    """``compile_specs.CONV1D_ALGORITHMS`` repeats the runtime's list (its
    registry, kernels/src/conv1d/registry.rs) so that export refuses an unknown
    name; the runtime names its own when it refuses one, and the two agree, so
    an algorithm registered on one side only fails here."""
    with pytest.raises(ValueError, match="is not one of") as refused:
        plan_blob(b"", [("conv1d_algorithm", b"no_such_algorithm")])
    listed = str(refused.value).split("is not one of ", 1)[1]
    assert tuple(name.strip() for name in listed.split(",")) == CONV1D_ALGORITHMS
