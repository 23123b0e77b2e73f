"""The soak's logic in seconds (scripts/soak.sh runs it for minutes):
pte_runner's -check_outputs, which fails when an iteration's outputs differ
from the first's and holds for a state restarted every iteration
(-reset_state); the memory criterion; and one short soak of one program."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, pte_runner_path
from executorch.exir import to_edge
from rustconv import RustConvPartitioner, blocks
from torch.export import export

sys.path.insert(0, str(ROOT / "scripts"))
import soak  # noqa: E402


@pytest.fixture(scope="module")
def stateful(tmp_path_factory):
    """A causal conv stack whose conv states the delegate owns, and the
    inputs of two calls."""
    torch.manual_seed(0)
    model = blocks.CausalConvStackStreaming(8, k=3, layers=3).eval()
    program = to_edge(export(model, model.make_inputs(seq=4))).to_backend(RustConvPartitioner())
    folder = tmp_path_factory.mktemp("soak")
    pte = folder / "conv_state.pte"
    pte.write_bytes(program.to_executorch().buffer)
    calls = []
    for k in range(2):
        calls.append(folder / f"call{k}.npz")
        inputs = model.make_inputs(seq=4, seed=k + 1)
        np.savez(calls[-1], **{str(i): t.numpy() for i, t in enumerate(inputs)})
    return pte, calls


def runner(*args):
    return subprocess.run(
        [str(pte_runner_path()), *args], capture_output=True, text=True, timeout=120
    )


def test_check_outputs_fails_on_a_carried_state_and_holds_when_reset(stateful):
    pte, calls = stateful
    single = ["-model_path", str(pte), "-inputs_npz_path", str(calls[0]), "-iter", "20"]
    run = runner(*single, "-check_outputs")
    assert run.returncode == 1, run.stdout
    assert "-check_outputs: iteration 1 (call 0) gave other outputs" in run.stderr, run.stderr
    run = runner(*single, "-check_outputs", "-reset_state")
    assert run.returncode == 0, run.stderr[-2000:]
    assert (
        "outputs checked: 20 iteration(s), warm-ups included, all equal to the first" in run.stdout
    )
    # A sequence: each iteration's call k against the first iteration's.
    steps = ["-model_path", str(pte), "-steps_npz_paths", ",".join(map(str, calls)), "-iter", "20"]
    assert runner(*steps, "-check_outputs").returncode == 1
    run = runner(*steps, "-check_outputs", "-reset_state")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "outputs checked: 20 iteration(s)" in run.stdout


def test_memory_criterion():
    times = [0.1 * i for i in range(100)]
    flat = [50_000 + (i % 3) for i in range(100)]
    assert soak.memory_verdict(times, flat)[3] == ""
    # Growth during warm-up (the first 20%) is allowed.
    warming = [40_000 + 500 * i if i < 15 else 50_000 for i in range(100)]
    assert soak.memory_verdict(times, warming)[3] == ""
    leaking = [50_000 + 40 * i for i in range(100)]
    warm, end, growth, error = soak.memory_verdict(times, leaking)
    assert growth == end - warm > 1024 + 500 and "grew" in error
    assert "too few samples" in soak.memory_verdict(times[:5], flat[:5])[3]


def test_a_short_soak_of_one_program(stateful, tmp_path):
    pte, calls = stateful
    report = tmp_path / "report.json"
    code = soak.main([
        "3", "--pte", str(pte), "--inputs", str(calls[0]), "--threads", "1", "--sample-s", "0.05",
        "--runner", str(pte_runner_path()), "--out", str(report),
    ])  # fmt: skip
    (result,) = json.loads(report.read_text())
    assert code == 0, result
    assert result["checked"] and not result["error"]
    assert result["iterations"] > 1000 and len(result["rss_kib"]) > 20
    assert result["growth_kib"] <= result["bound_kib"]
