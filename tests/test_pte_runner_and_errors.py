"""pte_runner's command line, its ETDump, and how bad input is reported:
corrupt delegate blobs, corrupt programs, wrong inputs, missing files, bad
npz files, thread counts no machine can start; and the state ExecuTorch owns
starting at zero."""

import copy
import os
import random
import subprocess
import zipfile

import numpy as np
import pytest
import torch
from conftest import ATOL, ROOT, assert_close, pte_runner_path, run_runtime
from executorch.exir import to_edge, to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from rustconv.examples.blocks import CausalDepthwiseConvStreaming
from torch.export import export


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


@pytest.fixture(scope="module")
def pte_bytes() -> bytes:
    torch.manual_seed(0)
    ep = export(Conv().eval(), (torch.randn(1, 4, 32),))
    return to_edge(ep).to_backend(RustConvPartitioner()).to_executorch().buffer


def runner(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        # errors="replace": a corrupt program's names reach the log as they are.
        [str(pte_runner_path()), *args], capture_output=True, text=True, errors="replace",
        timeout=120, env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


def error_line(run: subprocess.CompletedProcess) -> str:
    """The one line pte_runner ends a failure with (a clean exit, no signal)."""
    assert run.returncode > 0, (run.returncode, run.stderr[-2000:])
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("pte_runner: error: "), run.stderr
    return last


def test_random_inputs_latency_summary_and_etdump(pte_bytes, tmp_path):
    from executorch.devtools import Inspector

    pte = tmp_path / "m.pte"
    pte.write_bytes(pte_bytes)
    etdump = tmp_path / "trace.etdump"
    run = runner("--model_path", str(pte), "-iter", "5", "-etdump_path", str(etdump),
                 "-num_threads=1")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "5 iteration(s), 1 thread(s)" in run.stdout
    for stat in ("p10", "p50", "p90", "min", "avg", "max"):
        assert f"{stat} " in run.stdout and " ms" in run.stdout
    inspector = Inspector(etdump_path=str(etdump))
    executes = [
        e for block in inspector.event_blocks for e in block.events if e.name == "Method::execute"
    ]
    assert len(executes) == 1 and len(executes[0].perf_data.raw) == 5
    delegate_calls = [
        e for block in inspector.event_blocks for e in block.events if e.name == "DELEGATE_CALL"
    ]
    assert delegate_calls and len(delegate_calls[0].perf_data.raw) == 5


def _corrupt(pte_bytes: bytes, offset: int, value: bytes) -> bytes:
    at = pte_bytes.index(b"RCNV")
    data = bytearray(pte_bytes)
    data[at + offset : at + offset + len(value)] = value
    return bytes(data)


@pytest.mark.parametrize(
    "offset,value,message",
    [
        (4, (2).to_bytes(4, "little"), "blob layout version 2 is newer than this runtime"),
        (0, b"XXXX", "not a RustConv delegate blob"),
        (24, (10**9).to_bytes(8, "little"), "flatbuffer graph spans bytes"),
        (52, b"\xff\xff\xff\xff", "flatbuffer graph"),  # the flatbuffer's identifier
        # A graph too short to hold a flatbuffer's root offset and identifier:
        # flatbuffers' identifier check asserted (a panic) rather than failing.
        (24, (4).to_bytes(8, "little"), "graph is 4 bytes, too short for a flatbuffer"),
    ],
    ids=["newer-version", "bad-magic", "truncated-graph", "corrupt-graph", "graph-under-8-bytes"],
)
def test_corrupt_blob_fails_init_with_a_clear_log_line(pte_bytes, tmp_path, offset, value, message):
    pte = tmp_path / "bad.pte"
    pte.write_bytes(_corrupt(pte_bytes, offset, value))
    run = runner("-model_path", str(pte))
    assert "loading method 'forward' failed" in error_line(run)
    assert "RustConvBackend: init failed" in run.stderr and message in run.stderr, run.stderr
    with pytest.raises(RuntimeError):
        run_runtime(pte, (torch.randn(1, 4, 32),))


def test_constant_segment_shorter_than_its_constants_fails_init_naming_one(pte_bytes, tmp_path):
    """The blob's header says its constants end 4 bytes before the last one
    (the conv's bias) does: init refuses it, naming that value, before any
    kernel could read past the segment."""
    at = pte_bytes.index(b"RCNV")
    segment_len = int.from_bytes(pte_bytes[at + 40 : at + 48], "little")
    pte = tmp_path / "short.pte"
    pte.write_bytes(_corrupt(pte_bytes, 40, (segment_len - 4).to_bytes(8, "little")))
    run = runner("-model_path", str(pte))
    assert "loading method 'forward' failed" in error_line(run)
    assert "RustConvBackend: init failed" in run.stderr, run.stderr
    assert "('p_conv_bias'): constant bytes" in run.stderr, run.stderr
    assert "lie outside the" in run.stderr, run.stderr
    with pytest.raises(RuntimeError):
        run_runtime(pte, (torch.randn(1, 4, 32),))


def test_wrong_input_shape_and_dtype_are_refused(pte_bytes, tmp_path):
    pte = tmp_path / "m.pte"
    pte.write_bytes(pte_bytes)
    with pytest.raises(RuntimeError):
        run_runtime(pte, (torch.randn(1, 4, 33),))
    with pytest.raises(RuntimeError):
        run_runtime(pte, (torch.randn(1, 4, 32, dtype=torch.float64),))
    bad = tmp_path / "in.npz"
    np.savez(bad, **{"0": np.zeros((1, 4, 32), np.float64)})
    assert "input 0 is F64" in error_line(
        runner("-model_path", str(pte), "-inputs_npz_path", str(bad))
    )
    np.savez(bad, **{"0": np.zeros((1, 5, 32), np.float32)})
    assert "input 0 with shape [1, 5, 32]" in error_line(
        runner("-model_path", str(pte), "-inputs_npz_path", str(bad))
    )


def test_missing_files_bad_npz_and_bad_flags(pte_bytes, tmp_path):
    pte = tmp_path / "m.pte"
    pte.write_bytes(pte_bytes)
    assert "does not exist" in error_line(runner("-model_path", str(tmp_path / "nope.pte")))
    not_npz = tmp_path / "x.npz"
    not_npz.write_bytes(b"definitely not a zip")
    assert "is not an npz file" in error_line(
        runner("-model_path", str(pte), "-inputs_npz_path", str(not_npz))
    )
    empty = tmp_path / "empty.npz"
    np.savez(empty, **{"1": np.zeros(3, np.float32)})
    assert 'no array named "0"' in error_line(
        runner("-model_path", str(pte), "-inputs_npz_path", str(empty))
    )
    assert "cannot open" in error_line(
        runner("-model_path", str(pte), "-inputs_npz_path", str(tmp_path / "missing.npz"))
    )
    assert "unknown flag" in error_line(runner("-model_path", str(pte), "-frobnicate", "1"))
    assert "-model_path is required" in error_line(runner("-iter", "2"))
    garbage = tmp_path / "garbage.pte"
    garbage.write_bytes(b"\x00" * 64)
    assert "loading program" in error_line(runner("-model_path", str(garbage)))
    assert runner("-help").returncode == 0


FIXTURE_PTE = ROOT / "tests" / "fixtures" / "v1_causal_conv_scan.pte"


def test_corrupted_programs_fail_cleanly(tmp_path):
    """Copies of a program with 1 to 8 random bytes changed (a fixed seed):
    each runs or fails with pte_runner's error line, never a signal. With
    ExecuTorch's minimal verification 55 of these 300 crashed the runner
    (SIGSEGV in parseTensor); other seeds also hit SIGABRT in
    Method::get_output."""
    original = FIXTURE_PTE.read_bytes()
    rng = random.Random(20)
    failed = 0
    for k in range(300):
        data = bytearray(original)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        pte = tmp_path / "corrupt.pte"
        pte.write_bytes(data)
        run = runner("-model_path", str(pte))
        assert run.returncode >= 0, f"copy {k}: signal {-run.returncode}: {run.stderr[-2000:]}"
        if run.returncode:
            error_line(run)
            failed += 1
    assert failed > 200, failed


def test_an_output_index_out_of_range_is_an_error_not_an_abort(tmp_path):
    """The execution plan's output value index (7 in the fixture) raised
    past the plan's values: load_method accepts it, and Method::get_output
    aborted on it (ET_CHECK i < n_value_)."""
    data = bytearray(FIXTURE_PTE.read_bytes())
    assert data[496:500] == (7).to_bytes(4, "little")  # the fixture's layout
    data[499] = 0xCD
    pte = tmp_path / "bad_output.pte"
    pte.write_bytes(data)
    run = runner("-model_path", str(pte))
    assert "reading output 0 failed: Error::InvalidProgram" in error_line(run)
    assert "out of range" in run.stderr


def test_minimal_verification_still_runs_good_programs():
    run = runner("-model_path", str(FIXTURE_PTE), "-minimal_verification")
    assert run.returncode == 0, run.stderr
    assert "output 0: F32 [1, 4, 32]" in run.stdout


def _npy_v1(header: str, data: bytes) -> bytes:
    text = header
    while (10 + len(text) + 1) % 64:
        text += " "
    text += "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + data


@pytest.mark.parametrize(
    "shape,data_len,message",
    [
        ("(1, 4, 2000000000)", 320, "needs 32000000000 bytes of data but the array has 320"),
        ("(4611686018427387904, 4)", 0, "exceeds ExecuTorch's sizes (int32)"),
    ],
    ids=["32-GB-claimed", "wrapping-size"],
)
def test_npz_sizes_are_checked_before_allocating(tmp_path, shape, data_len, message):
    """A 1 KB npz claiming 32 GB aborted pte_runner (an allocation of the
    claimed size); a shape whose size wraps read as an empty array."""
    npz = tmp_path / "in.npz"
    with zipfile.ZipFile(npz, "w") as z:
        header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
        z.writestr("0.npy", _npy_v1(header, bytes(data_len)))
    run = runner("-model_path", str(FIXTURE_PTE), "-inputs_npz_path", str(npz))
    line = error_line(run)
    assert 'array "0" of' in line and message in line, line


@pytest.mark.parametrize("flag", ["-num_threads", "-rustconv_threads"])
def test_thread_counts_beyond_the_machine_are_refused_before_any_pool(flag):
    """100000 threads: a clean error, then a segfault at exit in
    pthreadpool_destroy (and 20000 a failed panic elsewhere). Refused at
    parse time now, with the bound in the message."""
    cap = 8 * os.cpu_count()
    for n in (100000, cap + 1):
        run = runner("-model_path", str(FIXTURE_PTE), flag, str(n))
        assert f"{flag} must be between 1 and {cap}" in error_line(run)
    assert runner("-model_path", str(FIXTURE_PTE), flag, "3").returncode == 0


def test_a_programs_thread_count_is_lowered_to_the_machines(tmp_path):
    """A compile spec of 100000 threads (the program's bytes set it): the
    delegate runs on at most 8 per core instead of starting up to 65535
    rayon threads (minutes and gigabytes, or a failure to start them)."""
    from rustconv.compile_specs import num_threads

    torch.manual_seed(0)
    # Large enough (6M multiply-adds) to run on a pool, not the caller alone.
    conv = torch.nn.Conv1d(32, 32, 3, padding=1).eval()
    ep = export(conv, (torch.randn(1, 32, 2048),))
    partitioner = RustConvPartitioner(compile_specs=[num_threads(100000)])
    pte = tmp_path / "threads.pte"
    pte.write_bytes(to_edge(ep).to_backend(partitioner).to_executorch().buffer)
    run = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def xnnpack_decode_steps(tmp_path):
    """An XNNPACK-only decode program whose state is a mutable buffer in
    ExecuTorch's planned memory (exported without InitializedMutableBufferPass),
    and three one-token calls: the model, the steps, the .pte and the npz files."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    torch.manual_seed(0)
    model = CausalDepthwiseConvStreaming(16).eval()
    steps = [torch.randn(1, 16, 1) for _ in range(3)]
    program = to_edge_transform_and_lower(
        export(copy.deepcopy(model), (steps[0],)), partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    pte = tmp_path / "step.pte"
    pte.write_bytes(program.buffer)
    files = []
    for k, x in enumerate(steps):
        files.append(tmp_path / f"in{k}.npz")
        np.savez(files[-1], **{"0": x.numpy()})
    return model, steps, pte, files


@pytest.mark.parametrize("threads", [1, 3])
def test_state_that_executorch_owns_starts_at_zero(tmp_path, threads):
    """An XNNPACK-only decode program (xnnpack_decode_steps):
    pte_runner's planned memory is zeroed, so its calls equal eager's from
    the zero state. MALLOC_PERTURB_ fills fresh heap memory with garbage, as
    the uninitialised buffers it allocated before held (7e29 and the like)."""
    model, steps, pte, files = xnnpack_decode_steps(tmp_path)
    out = tmp_path / "out.npz"
    run = runner("-model_path", str(pte), "-steps_npz_paths", ",".join(map(str, files)),
                 "-output_npz_path", str(out), "-num_threads", str(threads),
                 env={"MALLOC_PERTURB_": "165"})  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    with torch.no_grad():
        for k, x in enumerate(steps):
            got = np.load(tmp_path / f"out.{k}.npz")["0"]
            assert_close(got, model(x), f"call {k}", ATOL)


def test_reset_state_restarts_state_that_executorch_owns(tmp_path):
    """-reset_state puts ExecuTorch's planned memory back as loaded, so an
    XNNPACK-only decode program (its state a mutable buffer that XNNPACK
    updates) replays its sequence from the start each iteration: every
    iteration's outputs equal the first's (-check_outputs). Before, it reset
    RustConv's delegate-owned state only and the second iteration continued
    from the first's state."""
    _, _, pte, files = xnnpack_decode_steps(tmp_path)
    args = ["-model_path", str(pte), "-steps_npz_paths", ",".join(map(str, files)),
            "-warmup", "0", "-iter", "3", "-check_outputs"]  # fmt: skip
    carried = runner(*args)
    assert carried.returncode != 0, "without -reset_state the state carries over"
    reset = runner(*args, "-reset_state")
    assert reset.returncode == 0, reset.stderr[-2000:]


def test_initialized_mutable_buffer_pass_values_replace_the_zeros(tmp_path):
    """The other convention, which the zeros leave intact: a state exported
    with InitializedMutableBufferPass starts at its exported values (0.5
    here), which load_method copies over the zeroed planned memory."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    torch.manual_seed(0)
    model = CausalDepthwiseConvStreaming(16).eval()
    model.state.fill_(0.5)
    x = torch.randn(1, 16, 1)
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["state"])])
    program = to_edge_transform_and_lower(
        export(copy.deepcopy(model), (x,)), partitioner=[XnnpackPartitioner()]
    ).to_executorch(config)
    pte, in_npz, out = tmp_path / "init.pte", tmp_path / "in.npz", tmp_path / "out.npz"
    pte.write_bytes(program.buffer)
    np.savez(in_npz, **{"0": x.numpy()})
    run = runner("-model_path", str(pte), "-inputs_npz_path", str(in_npz),
                 "-output_npz_path", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    with torch.no_grad():
        assert_close(np.load(out)["0"], model(x), "first call", ATOL)
