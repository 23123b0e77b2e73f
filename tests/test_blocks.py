"""The reference blocks (rustconv.examples.blocks) end to end through the Rust runtime:
each block, in both lowering flows, is one RustConvBackend call and matches
eager; the LFM2 example's convolution state is updated across calls; a
dynamic sequence length runs at any length up to its bound; and a program
exported by the previous release (before fused kernels) still loads and runs."""

import copy

import numpy as np
import pytest
import torch
from conftest import ROOT, assert_close, delegate_backends, input_sets, run_runtime, save
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.runtime import Runtime
from rustconv import RustConvPartitioner, blocks
from torch.export import export

BLOCKS = {
    "lfm2_example_core": lambda: blocks.Lfm2ShortConvExampleCore(16),
    "lfm2_example": lambda: blocks.Lfm2ShortConvExample(16),
    "lfm2_hf_core": lambda: blocks.Lfm2ShortConvHFCore(16),
    "lfm2_hf": lambda: blocks.Lfm2ShortConvHF(16),
    "hyena": lambda: blocks.HyenaLongConv(8, 64),
    "diagonal_ssm": lambda: blocks.DiagonalSSM(8),
    "conv_stack": lambda: blocks.ConvStack(8, 5),
}
FLOWS = ["to_edge", "transform"]


def _model(name):
    torch.manual_seed(0)
    return BLOCKS[name]().eval()


def _program(model, example, flow, dynamic_shapes=None):
    ep = export(model, example, dynamic_shapes=dynamic_shapes)
    if flow == "to_edge":
        edge = to_edge(ep).to_backend(RustConvPartitioner())
    else:
        edge = to_edge_transform_and_lower(
            ep, partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
        )
    return edge.to_executorch()


def _eager(model, inputs):
    """A fresh copy per call: the runtime starts from the exported state too."""
    with torch.no_grad():
        return copy.deepcopy(model)(*inputs)


def _atol(want):
    # all-ones inputs through a deep stack grow; compare relative to the scale.
    return 1e-4 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_is_one_call_and_matches_eager(name, flow, tmp_path):
    model = _model(name)
    example = model.make_inputs()
    program = _program(model, example, flow)
    assert delegate_backends(program).count("RustConvBackend") == 1, delegate_backends(program)
    pte = save(program, tmp_path)
    for kind, inputs in input_sets(*(t.shape for t in example)).items():
        want = _eager(model, inputs)
        got = run_runtime(pte, inputs)[0]
        assert_close(got, want, f"{name}, {flow}, {kind}", _atol(want))


def test_lfm2_example_state_carries_over_between_calls(tmp_path):
    model = _model("lfm2_example")
    example = model.make_inputs(seq=8)
    pte = save(_program(model, example, "to_edge"), tmp_path)
    method = Runtime.get().load_program(str(pte)).load_method("forward")
    eager = copy.deepcopy(model)
    for step in range(3):
        inputs = model.make_inputs(seq=8, seed=step)
        with torch.no_grad():
            want = eager(*inputs)
        got = method.execute(list(inputs))[0]
        assert_close(got, want, f"call {step}", _atol(want))


@pytest.mark.parametrize("name", ["lfm2_example_core", "lfm2_hf_core", "diagonal_ssm"])
def test_dynamic_sequence_length(name, tmp_path):
    model = _model(name)
    program = _program(model, model.make_inputs(), "to_edge", model.dynamic_shapes())
    assert delegate_backends(program).count("RustConvBackend") == 1
    pte = save(program, tmp_path)
    for seq in (4, 17, 100):
        inputs = model.make_inputs(seq=seq, seed=seq)
        want = _eager(model, inputs)
        assert_close(run_runtime(pte, inputs)[0], want, f"{name}, seq {seq}", _atol(want))


def test_v1_program_still_loads_and_matches():
    """A .pte exported before Node.kernel existed (every node kernel -1)."""
    fixtures = ROOT / "tests" / "fixtures"
    with np.load(fixtures / "v1_causal_conv_scan.npz") as data:
        x, a, expected = (torch.from_numpy(data[k]) for k in ("x", "a", "expected"))
    got = run_runtime(fixtures / "v1_causal_conv_scan.pte", (x, a))[0]
    assert_close(got, expected, "v1 fixture")


@pytest.mark.parametrize("name", ["lfm2_hf_core", "hyena", "diagonal_ssm", "conv_stack"])
def test_block_in_float16(name, tmp_path):
    """Tensors stay float16 between the delegate and ExecuTorch; the kernels
    compute in float32, so the result is float32 eager's up to fp16 rounding."""
    model = _model(name)
    example = model.make_inputs(dtype=torch.float16)
    program = _program(copy.deepcopy(model).half(), example, "to_edge")
    assert delegate_backends(program).count("RustConvBackend") == 1
    got = run_runtime(save(program, tmp_path), example)[0]
    assert got.dtype == torch.float16
    want = _eager(model, tuple(t.float() for t in example))
    scale = max(1.0, want.abs().max().item())
    assert_close(got.float(), want, f"{name} fp16", 2e-2 * scale)


@pytest.mark.parametrize("flow", FLOWS)
def test_wide_conv_stack_runs_fft_gemm_with_relu_in_its_loops(flow, tmp_path):
    """A conv stack wide enough for the cost model to pick fft_gemm (128
    channels, K = 11, 1024 samples; at 64 channels the GEMM runs as fast):
    every conv runs it with its ReLU fused into the output rows, still one
    call, matching eager."""
    import rustconv.runtime  # noqa: F401  (the plan comes from the Rust library)
    from rustconv.devtools.inspect import delegate_calls, plan_blob

    torch.manual_seed(0)
    model = blocks.ConvStack(128, 11).eval()
    example = model.make_inputs(seq=1024)
    program = _program(model, example, flow)
    assert delegate_backends(program).count("RustConvBackend") == 1
    (call,) = delegate_calls(program.buffer)
    kernels = plan_blob(call.blob, call.compile_specs)["kernels"]
    assert len(kernels) == 12, kernels
    for kernel in kernels:
        assert kernel["algorithm"] == "fft_gemm", kernel
        assert "epilogue in its loops" in kernel["fusion"], kernel
        assert [op["op"] for op in kernel["absorbed"]].count("relu") == 1, kernel
    pte = save(program, tmp_path)
    for kind, inputs in input_sets(*(t.shape for t in example)).items():
        want = _eager(model, inputs)
        assert_close(run_runtime(pte, inputs)[0], want, f"{flow}, {kind}", _atol(want))
