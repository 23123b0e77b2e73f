"""pte_runner -concurrent: methods of one program run on native threads at
once (two methods; two loads of one method), every output compared bit for
bit with a single-threaded run of the same loads; and the backend option
reset_state set from a third thread meanwhile. Short runs (seconds); the
ThreadSanitizer run of the same is ``scripts/sanitize.sh --thread``."""

import re
import subprocess

import pytest
import torch
from conftest import pte_runner_path
from executorch.exir import to_edge
from rustconv import RustConvPartitioner, blocks
from torch.export import export

ITERATIONS = 2000
#: A call of the wide method splits across threads (its minimum latency
#: halves at 2 threads): the pools' paths run concurrently too.
WIDE_ITERATIONS = 50


class Conv(torch.nn.Module):
    """No state: every call gives the same outputs for the same inputs."""

    def __init__(self, channels=8, groups=1):
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, 3, padding=1, groups=groups)

    def forward(self, x):
        return torch.nn.functional.silu(self.conv(x))


@pytest.fixture(scope="module")
def pte(tmp_path_factory):
    """One program of four methods: a conv without state, a wide depthwise
    one, and a causal conv stack and a diagonal SSM whose conv and scan
    states the delegate owns (each one RustConvBackend call)."""
    torch.manual_seed(0)
    stack = blocks.CausalConvStackStreaming(8, k=3, layers=3).eval()
    ssm = blocks.DiagonalSSMStreaming(8).eval()
    programs = {
        "stateless": export(Conv().eval(), (torch.randn(1, 8, 16),)),
        "wide": export(Conv(1024, groups=1024).eval(), (torch.randn(1, 1024, 2048),)),
        "conv_state": export(stack, stack.make_inputs(seq=4)),
        "scan_state": export(ssm, ssm.make_inputs(seq=4)),
    }
    edge = to_edge(programs).to_backend(RustConvPartitioner())
    program = edge.to_executorch()
    for name in programs:
        # The state lives in the delegate: no buffer is mutated outside it.
        assert not program.exported_program(name).graph_signature.buffers_to_mutate, name
        plan = next(p for p in program.executorch_program.execution_plan if p.name == name)
        assert [d.id for d in plan.delegates] == ["RustConvBackend"], name
    path = tmp_path_factory.mktemp("concurrency") / "four_methods.pte"
    path.write_bytes(program.buffer)
    return path


def concurrent(pte, methods, *extra, iterations=ITERATIONS):
    run = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte), "-method", methods,
         "-concurrent", str(iterations), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    counts = dict(re.findall(r"^([a-z ]+): (\d+)$", run.stdout, re.MULTILINE))
    lanes = re.findall(
        r"^lane \d+ '(\w+)': (\d+) iteration\(s\), (\d+) mismatch\(es\), (\d+) restart\(s\)$",
        run.stdout,
        re.MULTILINE,
    )
    return run, {k: int(v) for k, v in counts.items()}, lanes


def overlapping(pte, methods, *extra, iterations=ITERATIONS):
    """``concurrent`` until its calls overlapped, at most three runs: a
    lane of small calls (2000 of a few microseconds) can finish inside one
    time slice on a loaded 2-core machine before the other starts. Every
    run's outputs are checked (the caller checks the last; the earlier ones
    here)."""
    for _ in range(3):
        run, counts, lanes = concurrent(pte, methods, *extra, iterations=iterations)
        if run.returncode != 0 or counts.get("overlapping calls", 0) > 0:
            break
        assert counts["mismatches"] == 0, run.stdout
    return run, counts, lanes


@pytest.mark.parametrize(
    "methods",
    ["stateless,conv_state", "conv_state,scan_state", "conv_state,conv_state",
     "scan_state,scan_state", "stateless,stateless"],
    ids=["two-methods", "two-stateful-methods", "two-loads-conv-state",
         "two-loads-scan-state", "two-loads-stateless"],
)  # fmt: skip
@pytest.mark.parametrize("threads", ["1", "2"])
def test_concurrent_lanes_match_the_single_threaded_run(pte, methods, threads):
    run, counts, lanes = overlapping(pte, methods, "-num_threads", threads)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert [lane[0] for lane in lanes] == methods.split(",")
    for _, iterations, mismatches, restarts in lanes:
        assert (int(iterations), int(mismatches), int(restarts)) == (ITERATIONS, 0, 0)
    assert counts["mismatches"] == 0
    # The lanes really ran at once: calls began while another was running.
    assert counts["overlapping calls"] > 0, run.stdout


def test_two_loads_whose_calls_use_the_pool(pte):
    run, counts, lanes = overlapping(
        pte, "wide,wide", "-num_threads", "2", iterations=WIDE_ITERATIONS
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert [(int(i), int(m)) for _, i, m, _ in lanes] == [(WIDE_ITERATIONS, 0)] * 2
    assert counts["mismatches"] == 0 and counts["overlapping calls"] > 0, run.stdout


def test_reset_from_a_third_thread_restarts_states_and_nothing_else(pte):
    """Each call of a lane gives the single-threaded run's next outputs or,
    after a reset, its first: a state is carried or restarted whole, never
    torn, and nothing crashes."""
    run, counts, lanes = concurrent(
        pte,
        "conv_state,scan_state,stateless",
        "-num_threads",
        "1",
        "-reset_concurrently",
        # Long enough for a few hundred resets (0 to 2 ms apart).
        iterations=10 * ITERATIONS,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert counts["mismatches"] == 0 and counts["resets from another thread"] > 0, run.stdout
    restarts = {method: int(r) for method, _, _, r in lanes}
    # The stateful lanes saw restarts (so their outputs depend on the state
    # and the comparison tells a carried state from a restarted one); the
    # stateless lane's outputs are the same either way.
    assert restarts["conv_state"] > 0 and restarts["scan_state"] > 0, run.stdout
    assert restarts["stateless"] == 0, run.stdout


def test_a_lane_that_fails_is_an_error_not_a_crash(pte):
    run, _, _ = concurrent(pte, "stateless,no_such_method", iterations=10)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "pte_runner: error: method 'no_such_method'" in run.stderr.splitlines()[-1]
