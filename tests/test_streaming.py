"""Token-by-token decoding with state owned by the delegate.

Three streaming blocks (LFM2's short conv in ExecuTorch's example form, a
diagonal SSM whose scan starts from a state buffer, a causal conv stack) are
exported once with a dynamic length (1..64): a prefill of N tokens then T
single-token calls must give eager's outputs on the whole sequence, in
``executorch.runtime`` and in ``pte_runner``; a reset replays the same
outputs; the buffer is delegate-owned (no buffer input, no ``copy_`` left in
the program) and the block is one RustConvBackend call.
"""

import copy
import subprocess

import numpy as np
import pytest
import torch
from conftest import assert_close, delegate_backends, pte_runner_path, save
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.runtime import Runtime
from rustconv import RustConvPartitioner, blocks
from rustconv import runtime as rc_runtime
from rustconv.devtools.inspect import delegate_calls, plan_blob
from torch.export import export

ATOL = 1e-4
PREFILL, DECODE = 7, 5

STREAMING = {
    # name: (model factory, time axis of the inputs and output)
    "lfm2_example_core": (lambda: blocks.Lfm2ShortConvExampleCore(32, k=3), 1),
    "lfm2_example": (lambda: blocks.Lfm2ShortConvExample(32, k=4), 1),
    "diagonal_ssm": (lambda: blocks.DiagonalSSMStreaming(16), 2),
    "conv_stack": (lambda: blocks.CausalConvStackStreaming(8, k=3, layers=3), 2),
}


def _model(name):
    torch.manual_seed(0)
    return STREAMING[name][0]().eval()


def _program(model, flow="to_edge", partitioner=None, dtype=torch.float32):
    example = model.make_inputs(seq=8, dtype=dtype)
    dynamic = model.dynamic_shapes(blocks.seq_dim(64, min_len=1))
    ep = export(copy.deepcopy(model), example, dynamic_shapes=dynamic)
    partitioner = partitioner or RustConvPartitioner()
    if flow == "to_edge":
        edge = to_edge(ep).to_backend(partitioner)
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )

        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner, XnnpackPartitioner()])
    return edge.to_executorch()


def _pieces(model, axis, seed=1):
    """The whole sequence, and its prefill + single-token calls."""
    whole = model.make_inputs(seq=PREFILL + DECODE, seed=seed)
    bounds = [(0, PREFILL)] + [(t, t + 1) for t in range(PREFILL, PREFILL + DECODE)]
    calls = [[x.narrow(axis, a, b - a).contiguous() for x in whole] for a, b in bounds]
    return whole, calls


def _eager(model, inputs):
    with torch.no_grad():
        return copy.deepcopy(model)(*inputs)


def _stream(method, calls, axis):
    return torch.cat([method.execute(call)[0] for call in calls], dim=axis)


@pytest.mark.parametrize("name", list(STREAMING))
def test_prefill_then_decode_matches_eager_and_resets(name, tmp_path):
    model = _model(name)
    axis = STREAMING[name][1]
    program = _program(model)
    assert delegate_backends(program) == ["RustConvBackend"]
    # The state lives in the delegate: the program mutates no buffer (no
    # buffer input, no copy_ back).
    assert not program.exported_program().graph_signature.buffers_to_mutate
    pte = save(program, tmp_path)

    whole, calls = _pieces(model, axis)
    want = _eager(model, whole)
    method = Runtime.get().load_program(str(pte)).load_method("forward")
    first = _stream(method, calls, axis)
    assert_close(first, want, f"{name}: prefill {PREFILL} + {DECODE} decode calls", ATOL)
    # Without a reset the state carries on: the replay differs.
    carried = _stream(method, calls, axis)
    assert (carried - want).abs().max().item() > 10 * ATOL, "state did not carry over"
    rc_runtime.reset_state()
    assert_close(_stream(method, calls, axis), want, f"{name}: after reset_state()", ATOL)
    # A method loaded again starts from the exported state too.
    again = Runtime.get().load_program(str(pte)).load_method("forward")
    assert_close(_stream(again, calls, axis), want, f"{name}: reloaded", ATOL)


@pytest.mark.parametrize("name", ["lfm2_example_core", "diagonal_ssm", "conv_stack"])
def test_prefill_then_decode_in_pte_runner(name, tmp_path):
    model = _model(name)
    axis = STREAMING[name][1]
    pte = save(_program(model), tmp_path)
    whole, calls = _pieces(model, axis, seed=2)
    want = _eager(model, whole)
    paths = []
    for k, call in enumerate(calls):
        paths.append(tmp_path / f"call{k}.npz")
        np.savez(paths[-1], **{str(i): t.numpy() for i, t in enumerate(call)})
    out = tmp_path / "out.npz"

    def run(*extra):
        result = subprocess.run(
            [str(pte_runner_path()), "-model_path", str(pte), "-steps_npz_paths",
             ",".join(map(str, paths)), "-output_npz_path", str(out), *extra],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        got = []
        for k in range(len(calls)):
            with np.load(tmp_path / f"out.{k}.npz") as o:
                got.append(torch.from_numpy(o["0"]))
        return torch.cat(got, dim=axis), result.stdout

    got, stdout = run()
    assert_close(got, want, f"{name} in pte_runner", ATOL)
    assert "first call latency:" in stdout
    # Three replays of the sequence with a reset before each: the last one
    # (the one written) is the first again; without resets it is not.
    got, _ = run("-iter", "3", "-reset_state")
    assert_close(got, want, f"{name} in pte_runner, replayed after reset_state", ATOL)
    got, _ = run("-iter", "3")
    assert (got - want).abs().max().item() > 10 * ATOL


def test_decode_steps_flag_times_decode_calls(tmp_path):
    model = _model("lfm2_example_core")
    pte = save(_program(model), tmp_path)
    _, calls = _pieces(model, 1)
    prefill, token = tmp_path / "prefill.npz", tmp_path / "token.npz"
    np.savez(prefill, **{str(i): t.numpy() for i, t in enumerate(calls[0])})
    np.savez(token, **{str(i): t.numpy() for i, t in enumerate(calls[1])})
    result = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte), "-steps_npz_paths",
         f"{prefill},{token}", "-decode_steps", "20", "-iter", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2 iteration(s) of 21 call(s)" in result.stdout
    assert "latency: p10" in result.stdout


def test_steps_write_an_etdump_of_every_call(tmp_path):
    """A streaming run's trace (bench/interference.py reads prefill and
    decode steps from it): one Method::execute per call, warm-ups included,
    and one RustConv delegate call in each. pte_runner wrote none before."""
    from rustconv.devtools.trace import read_profile

    model = _model("lfm2_example_core")
    pte = save(_program(model), tmp_path)
    _, calls = _pieces(model, 1)
    prefill, token = tmp_path / "prefill.npz", tmp_path / "token.npz"
    np.savez(prefill, **{str(i): t.numpy() for i, t in enumerate(calls[0])})
    np.savez(token, **{str(i): t.numpy() for i, t in enumerate(calls[1])})
    etdump = tmp_path / "steps.etdump"
    result = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte), "-steps_npz_paths",
         f"{prefill},{token}", "-decode_steps", "3", "-warmup", "1", "-iter", "2",
         "-etdump_path", str(etdump)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert etdump.is_file()
    profile = read_profile(etdump)
    assert len(profile.method_ms) == 3 * 4
    assert [c.backend for c in profile.calls] == ["RustConvBackend"]
    assert len(profile.calls[0].times_ms) == 3 * 4


def test_transform_flow_with_xnnpack_owns_state_too(tmp_path):
    model = _model("lfm2_example")
    program = _program(model, flow="transform")
    assert delegate_backends(program).count("RustConvBackend") == 1
    pte = save(program, tmp_path)
    whole, calls = _pieces(model, 1)
    method = Runtime.get().load_program(str(pte)).load_method("forward")
    assert_close(_stream(method, calls, 1), _eager(model, whole), "lfm2 + XNNPACK", ATOL)


def test_stateful_false_keeps_the_buffer_a_delegate_input(tmp_path):
    model = _model("lfm2_example_core")
    program = _program(model, partitioner=RustConvPartitioner(stateful=False))
    assert program.exported_program().graph_signature.buffers_to_mutate
    pte = save(program, tmp_path)
    whole, calls = _pieces(model, 1)
    method = Runtime.get().load_program(str(pte)).load_method("forward")
    assert_close(_stream(method, calls, 1), _eager(model, whole), "stateful=False", ATOL)


def test_state_memory_is_in_the_plan(tmp_path):
    model = _model("conv_stack")
    program = _program(model)
    (call,) = delegate_calls(program.buffer)
    plan = plan_blob(call.blob, call.compile_specs)
    # Three states [1, 8, 2] of f32, each on its own 64-byte line, and as
    # much again where their updates are written (the halves trade places
    # after each call: no copy).
    assert plan["state_bytes"] == 2 * 3 * 64
    states = [v for v in plan["values"] if v["role"] == "state"]
    assert [v["location"] for v in states] == ["state"] * 3
    updates = [v for v in plan["values"] if v["location"] == "next state"]
    assert len(updates) == 3, [v["location"] for v in plan["values"]]


@pytest.mark.parametrize("name", ["lfm2_example_core", "conv_stack"])
def test_float16_state_is_copied_rounded_and_streams_like_eager(name, tmp_path):
    """A float16 state keeps the copy at the end of each call (rounded to
    float16, as the model's copy_ would), where an f32 state trades halves
    with its update: prefill and decode calls still match eager, and a
    reset replays them."""
    model = _model(name)
    axis = STREAMING[name][1]
    program = _program(copy.deepcopy(model).half(), dtype=torch.float16)
    (call,) = delegate_calls(program.buffer)
    plan = plan_blob(call.blob, call.compile_specs)
    assert [v for v in plan["values"] if v["role"] == "state"], "no delegate-owned state"
    assert not [v for v in plan["values"] if v["location"] == "next state"]
    whole, calls = _pieces(model, axis)
    want = _eager(model, [x.half().float() for x in whole])
    method = Runtime.get().load_program(str(save(program, tmp_path))).load_method("forward")
    calls = [[x.half() for x in call] for call in calls]
    scale = max(1.0, want.abs().max().item())
    got = _stream(method, calls, axis)
    assert got.dtype == torch.float16
    assert_close(got.float(), want, f"{name} fp16 stream", 2e-2 * scale)
    rc_runtime.reset_state()
    assert_close(_stream(method, calls, axis).float(), want, f"{name} fp16 reset", 2e-2 * scale)


def test_lfm2_like_model_generates_like_eager(tmp_path):
    """A small LFM2-like LM (short-conv and attention layers) exported once
    with a dynamic length: a greedy generation loop (prompt, then one token
    per call) gives eager's tokens and logits; the conv states live in the
    RustConv delegates, the attention caches in ExecuTorch."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    torch.manual_seed(0)
    model = blocks.Lfm2LikeLM(vocab=64, dim=64, layers="cac", window=32).eval()
    ep = export(
        copy.deepcopy(model), model.make_inputs(seq=8), dynamic_shapes=model.dynamic_shapes()
    )
    edge = to_edge_transform_and_lower(
        ep, partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
    )
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(model.mutable_buffers())])
    program = edge.to_executorch(config)
    assert delegate_backends(program).count("RustConvBackend") == model.kinds.count("c")
    mutated = set(program.exported_program().graph_signature.buffers_to_mutate.values())
    assert not [b for b in mutated if "conv_state" in b], mutated
    assert any("k_cache" in b for b in mutated)
    pte = save(program, tmp_path)

    prompt = model.make_inputs(seq=6, seed=1)[0]
    with torch.no_grad():
        want_tokens, want_logits = blocks.generate(copy.deepcopy(model), prompt, 12)
    for attempt in range(2):  # a freshly loaded method starts over
        method = Runtime.get().load_program(str(pte)).load_method("forward")
        tokens, logits = blocks.generate(lambda t, m=method: m.execute([t])[0], prompt, 12)
        assert tokens == want_tokens, f"attempt {attempt}"
        for k, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
            assert_close(got, want, f"attempt {attempt}, call {k}", ATOL)
