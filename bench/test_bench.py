"""The benchmark tool end to end on one tiny setting, plus its parsers and
projections. Run: .venv/bin/python -m pytest -q bench (with pte_runner built)."""

import csv
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "partitioner_py")]

from bench import alternatives, measure, projection, report, rounds, run, workload, zoo  # noqa: E402

RUNNER = Path(os.environ.get("PTE_RUNNER", ROOT / "target" / "release" / "pte_runner"))


def test_parse_plan_line():
    text = (
        "I 00:00:00.034783 executorch:backend.cpp:86] RustConvBackend: plan: node 0 "
        "'aten_convolution_default' conv1d -> fft (estimated ms: direct 12.3, "
        "depthwise_simd 4.5, fft 1.2; prepared 2.0 MiB)\nunrelated line\n"
        "RustConvBackend: plan: node 3 'scan' linear_scan -> sequential\n"
    )
    conv, scan = measure.parse_plan_lines(text)
    assert (conv.node, conv.name, conv.op, conv.chosen) == (
        0,
        "aten_convolution_default",
        "conv1d",
        "fft",
    )
    assert conv.estimates_ms == {"direct": 12.3, "depthwise_simd": 4.5, "fft": 1.2}
    assert conv.prepared_mib == 2.0
    assert (scan.chosen, scan.estimates_ms, scan.prepared_mib) == ("sequential", {}, None)


def test_max_abs_diff_takes_outputs_of_any_rank():
    """A vocoder's output is a 1-D waveform (SpeechT5HifiGan called on one
    spectrogram): the error check indexed a channel axis and crashed on it."""
    want = np.linspace(-1.0, 1.0, 12, dtype=np.float32)
    got = want.copy()
    got[7] += 0.25
    assert alternatives.max_abs_diff(got, want) == pytest.approx(0.25)
    assert alternatives.max_abs_diff(got.reshape(2, 3, 2), want.reshape(2, 3, 2)) == (
        pytest.approx(0.25)
    )
    got[3] = np.nan
    assert math.isnan(alternatives.max_abs_diff(got, want))
    with pytest.raises(ValueError, match="shape"):
        alternatives.max_abs_diff(got.reshape(3, 4), want)


def test_next_fast_len_and_settings():
    assert [workload.next_fast_len(n) for n in (1, 7, 11, 127, 1025)] == [1, 7, 12, 128, 1029]
    full = workload.make_settings(workload.KINDS, workload.FULL_C, workload.FULL_N, workload.FULL_K)
    assert sum(s.kind == "conv" for s in full) == 56
    assert sum(s.kind == "scan" for s in full) == 14


def test_projection_scales_and_plans_repeats():
    p = projection.Projector(threads=2)
    small = workload.Setting("conv", 512, 1024, 4, "4")
    big = workload.Setting("conv", 512, 4096, 4, "4")
    assert p.project("eager", "direct", big).basis == "prior"
    p.record("eager", "direct", small, 0.5, measured=True)
    proj = p.project("eager", "direct", big)
    assert proj.seconds == pytest.approx(2.0) and proj.measured
    assert measure.plan_repeats(0.001, 2, 10, 3.0) == (20, measure.MAX_REPEATS)
    assert measure.plan_repeats(0.1, 2, 5, 3.0) == (2, 7)
    assert measure.plan_repeats(2.0, 2, 10, 3.0) == (1, 3)
    assert measure.plan_repeats(30.0, 2, 10, 3.0) == (1, 1)


@pytest.mark.skipif(not RUNNER.is_file(), reason="pte_runner not built (scripts/setup.sh)")
def test_end_to_end_tiny(tmp_path):
    out = tmp_path / "out"
    argv = [
        "C=8", "N=64", "K=4", "--warmup", "1", "--repeats", "2", "--threads", "1",
        "--bandwidth-mib", "16", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
        "--runner", str(RUNNER),
    ]  # fmt: skip
    # In this process, so torch and executorch are imported once.
    assert run.main(argv) == 0
    for name in ("results.csv", "results.json", "summary.md", "latency.png", "speedup.png"):
        assert (out / name).is_file(), name

    with open(out / "results.csv") as f:
        rows = {(r["kind"], r["alternative"]): r for r in csv.DictReader(f)}
    expect_ok = [("conv", a) for a in ("ours", "xnnpack", "et_cpu", "eager", "torch_fft")] + [
        ("scan", a) for a in ("ours", "eager", "c_scan")
    ]
    for key in expect_ok:
        row = rows[key]
        assert row["status"] == "ok", (key, row["status"], row["note"])
        assert float(row["median_ms"]) > 0, key
        assert float(row["max_abs_err"]) <= 1e-3, key
        assert row["peak_mib"] != "", key
    assert rows[("conv", "ours")]["rounds"] == "1"  # conv and scan: one round by default
    assert rows[("scan", "xnnpack")]["status"] == "n/a"
    assert rows[("scan", "et_cpu")]["status"] == "n/a"
    assert "RustConvBackend" in rows[("conv", "ours")]["delegated"]
    assert "XnnpackBackend" in rows[("conv", "xnnpack")]["delegated"]
    assert rows[("conv", "et_cpu")]["delegated"] == "no delegate"
    # Forced candidates, when the runtime reports its plan, each made a row.
    chosen = rows[("conv", "ours")]["chosen_kernel"]
    if chosen:
        assert ("conv", f"ours:{chosen}") in rows

    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["threads"] == 1 and meta["bandwidth_bytes_per_s"] > 0
    summary = (out / "summary.md").read_text()
    assert "## Goals" in summary and "conv C=8 N=64 K=4" in summary
    assert summary.count("**PASS**") + summary.count("**FAIL**") + summary.count("**n/a**") == 6


def test_blocks_filters():
    settings, alts = run.parse_filters(["blocks"], full=False)
    assert {s.block for s in settings} == set(workload.BLOCKS)
    assert all(s.kind == "blocks" for s in settings) and "io_floor" in alts
    ssm = next(s for s in settings if s.block == "ssm")
    assert (ssm.C, ssm.N) == (2048, 4096)
    settings, _ = run.parse_filters(["block=ssm,hyena", "C=16", "N=64"], full=False)
    assert [(s.block, s.C, s.N) for s in settings] == [("hyena", 16, 64), ("ssm", 16, 64)]
    default, _ = run.parse_filters([], full=False)
    assert not any(s.kind == "blocks" for s in default)
    # Decode steps run only when named, as blocks of one token.
    assert not any(
        s.block in workload.DECODE_BLOCKS for s in run.parse_filters(["blocks"], False)[0]
    )
    decode, _ = run.parse_filters(["decode"], full=False)
    assert {s.block for s in decode} == set(workload.DECODE_BLOCKS)
    assert all(s.kind == "blocks" and s.N == 1 for s in decode)
    assert sorted(s.C for s in decode if s.block == "decode_conv") == [1024, 2048, 4096]
    assert [(s.block, s.C) for s in decode if s.block == "decode_ssm"] == [("decode_ssm", 2048)]
    settings, _ = run.parse_filters(["block=decode_scan", "C=8"], full=False)
    assert [(s.block, s.C, s.N) for s in settings] == [("decode_scan", 8, 1)]


def test_forced_algorithm_filter():
    settings, alts = run.parse_filters(["block=conv_stack", "alt=ours,ours:fft_gemm"], full=False)
    assert alts == ("ours", "ours:fft_gemm")
    assert alternatives.steps_for(settings[0], alts) == ["ours", "ours:fft_gemm"]
    with pytest.raises(SystemExit):
        run.parse_filters(["alt=ours:nonesuch"], full=False)


@pytest.mark.skipif(not RUNNER.is_file(), reason="pte_runner not built (scripts/setup.sh)")
def test_forced_algorithm_on_a_block(tmp_path):
    out = tmp_path / "out"
    argv = [
        "block=conv_stack", "C=16", "N=64", "alt=ours,ours:gemm,ours:fft_gemm", "--warmup", "1",
        "--repeats", "2", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
        "--runner", str(RUNNER), "--no-plots",
    ]  # fmt: skip
    assert run.main(argv) == 0
    with open(out / "results.csv") as f:
        rows = {r["alternative"]: r for r in csv.DictReader(f)}
    for alt in ("ours", "ours:gemm", "ours:fft_gemm"):
        assert rows[alt]["status"] == "ok", (alt, rows[alt]["status"], rows[alt]["note"])
        assert int(rows[alt]["rustconv_calls"]) == 1
    assert rows["ours:fft_gemm"]["chosen_kernel"] == "fft_gemm", rows["ours:fft_gemm"]


@pytest.mark.skipif(not RUNNER.is_file(), reason="pte_runner not built (scripts/setup.sh)")
def test_end_to_end_blocks_tiny(tmp_path):
    out = tmp_path / "out"
    argv = [
        "blocks", "block=lfm2_hf,ssm", "C=16", "N=64", "--warmup", "1", "--repeats", "2",
        "--bandwidth-mib", "16", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
        "--runner", str(RUNNER), "--no-plots",
    ]  # fmt: skip
    assert run.main(argv) == 0
    with open(out / "results.csv") as f:
        rows = {(r["block"], r["alternative"]): r for r in csv.DictReader(f)}
    # Two blocks (tests/test_blocks.py runs every block through both runtimes).
    for block in ("lfm2_hf", "ssm"):
        for alt in ("ours", "ours_unfused", "xnnpack", "et_cpu", "eager"):
            row = rows[(block, alt)]
            assert row["status"] == "ok", (block, alt, row["status"], row["note"])
            assert float(row["median_ms"]) > 0 and row["peak_mib"] != "", (block, alt)
            assert float(row["max_abs_err"]) <= 1e-5, (block, alt)
        floor = rows[(block, "io_floor")]
        assert float(floor["median_ms"]) > 0 and int(floor["io_bytes"]) > 0
        assert int(rows[(block, "ours")]["rustconv_calls"]) >= 1
        assert int(rows[(block, "xnnpack")]["rustconv_calls"]) == 0
        assert int(rows[(block, "et_cpu")]["xnnpack_calls"]) == 0
    # The whole LFM2 block's linears go to XNNPACK in ours too.
    assert int(rows[("lfm2_hf", "ours")]["xnnpack_calls"]) >= 1
    # ONNX Runtime runs the exported block at the same thread count.
    ort = rows[("lfm2_hf", "onnxruntime")]
    assert ort["status"] == "ok" and float(ort["max_abs_err"]) <= 1e-3, (ort["status"], ort["note"])
    assert "intra_op_num_threads" in ort["note"]
    summary = (out / "summary.md").read_text()
    assert "## Blocks" in summary and "### Goals (blocks)" in summary
    assert "## Goals\n" not in summary  # no conv/scan goals in a blocks-only run
    goals = summary.split("### Goals (blocks)")[1].split("block goals pass")[0]
    # ssm, lfm2_hf, and peak memory.
    assert goals.count("**PASS**") + goals.count("**FAIL**") == 3


def test_overhead_alternatives_only_when_named():
    _, default = run.parse_filters([], full=False)
    assert not set(default) & set(run.OPT_IN_ALTERNATIVES)
    _, alts = run.parse_filters(["alt=ours,ours_traced,ours_baseline"], full=False)
    assert alts == ("ours", "ours_traced", "ours_baseline")
    with pytest.raises(SystemExit, match="baseline-runner"):
        run.main(["C=8", "N=64", "K=4", "alt=ours,ours_baseline", "--runner", str(RUNNER)])


@pytest.mark.skipif(not RUNNER.is_file(), reason="pte_runner not built (scripts/setup.sh)")
def test_overheads_tiny(tmp_path):
    """ETDump on and a baseline runner (here the same build) run ours' program."""
    out = tmp_path / "out"
    argv = [
        "conv", "C=8", "N=64", "K=4", "alt=ours,ours_traced,ours_baseline", "--warmup", "1",
        "--repeats", "2", "--threads", "1", "--bandwidth-mib", "16", "--out", str(out),
        "--cache-dir", str(tmp_path / "cache"), "--runner", str(RUNNER),
        "--baseline-runner", str(RUNNER), "--no-plots",
    ]  # fmt: skip
    assert run.main(argv) == 0
    with open(out / "results.csv") as f:
        rows = {r["alternative"]: r for r in csv.DictReader(f)}
    for alt in ("ours", "ours_traced", "ours_baseline"):
        assert rows[alt]["status"] == "ok", (alt, rows[alt]["status"], rows[alt]["note"])
        assert float(rows[alt]["max_abs_err"]) <= 1e-3
        assert "RustConvBackend" in rows[alt]["delegated"]
    summary = (out / "summary.md").read_text()
    assert "## Runtime overheads" in summary
    assert "ETDump on: geometric mean" in summary and "over the baseline: geometric mean" in summary


@pytest.mark.slow
@pytest.mark.skipif(not RUNNER.is_file(), reason="pte_runner not built (scripts/setup.sh)")
def test_end_to_end_decode_tiny(tmp_path):
    """One-token calls with state carried: every alternative runs and its
    first call from a fresh state agrees with eager's (the timed calls'
    counts differ between alternatives, so their last outputs do), ours is one
    RustConv call with no state buffer left to copy back, and the goals are
    checked."""
    out = tmp_path / "out"
    argv = [
        "decode", "C=16", "--warmup", "1", "--repeats", "2", "--bandwidth-mib", "16",
        "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--runner", str(RUNNER),
        "--no-plots", "--threads", "1",
    ]  # fmt: skip
    assert run.main(argv) == 0
    with open(out / "results.csv") as f:
        rows = {(r["block"], r["alternative"]): r for r in csv.DictReader(f)}
    for block in workload.DECODE_BLOCKS:
        for alt in ("ours", "ours_unfused", "xnnpack", "et_cpu", "eager"):
            row = rows[(block, alt)]
            assert row["status"] == "ok", (block, alt, row["status"], row["note"])
            assert float(row["median_ms"]) > 0, (block, alt)
            assert float(row["max_abs_err"]) <= 1e-5, (block, alt)
        assert rows[(block, "ours")]["N"] == "1"
        assert int(rows[(block, "ours")]["rustconv_calls"]) == 1, block
    summary = (out / "summary.md").read_text()
    goals = summary.split("### Goals (blocks)")[1].split("block goals pass")[0]
    # Six decode workloads and peak memory.
    assert goals.count("**PASS**") + goals.count("**FAIL**") == 7


@pytest.mark.skipif(not RUNNER.is_file(), reason="pte_runner not built (scripts/setup.sh)")
def test_end_to_end_zoo_tiny(tmp_path):
    """A zoo model (ExecuTorch's SileroVAD example, the tests' size) under
    every alternative, ONNX Runtime included, with its expected RustConv calls."""
    out = tmp_path / "out"
    argv = [
        "zoo", "size=small", "model=et_silero_vad", "--warmup", "1", "--repeats", "2",
        "--bandwidth-mib", "16", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
        "--runner", str(RUNNER), "--no-plots", "--threads", "1",
    ]  # fmt: skip
    assert run.main(argv) == 0
    with open(out / "results.csv") as f:
        rows = {r["alternative"]: r for r in csv.DictReader(f)}
    for alt in ("ours", "xnnpack", "et_cpu", "onnxruntime", "eager"):
        row = rows[alt]
        assert row["status"] == "ok", (alt, row["status"], row["note"])
        assert float(row["median_ms"]) > 0 and float(row["max_abs_err"]) <= 1e-4, alt
    # Three interleaved rounds by default for the zoo: the fastest kept.
    for alt in ("ours", "xnnpack", "onnxruntime"):
        medians = [float(m) for m in rows[alt]["round_medians_ms"].split(";")]
        assert rows[alt]["rounds"] == "3" and len(medians) == 3, alt
        assert float(rows[alt]["median_ms"]) == pytest.approx(min(medians), rel=1e-5), alt
    zoo_models, _ = zoo.modules()
    expected = zoo_models.MODELS["et_silero_vad"].build(False).rustconv_calls
    assert int(rows["ours"]["rustconv_calls"]) == expected
    assert int(rows["xnnpack"]["rustconv_calls"]) == 0
    summary = (out / "summary.md").read_text()
    assert "## Zoo" in summary and "### Goals (zoo)" in summary
    assert "every zoo model at least as fast as ONNX Runtime" in summary
    assert "- **Rounds:** 3 for zoo." in summary


def test_zoo_filters():
    settings, _ = run.parse_filters(
        ["zoo", "size=small", "model=hf_lfm2,et_lfm2_fp32:decode"], False
    )
    assert [(s.kind, s.block, s.size) for s in settings] == [
        ("zoo", "hf_lfm2", "small"),
        ("zoo", "et_lfm2_fp32:decode", "small"),
    ]
    with pytest.raises(SystemExit, match="unknown zoo model"):
        run.parse_filters(["model=nope"], False)
    with pytest.raises(SystemExit, match="size="):
        run.parse_filters(["zoo", "size=huge"], False)


def test_interference_splits_steps_and_compares_rounds():
    from bench import interference

    x, r = interference.XNNPACK, interference.RUSTCONV
    shipped = [(x, "a"), (x, "b1"), (x, "b2"), (x, "c"), (x, "b1"), (x, "b2")]
    ours = [(x, "a"), (x, "b"), (r, "conv"), (x, "c"), (x, "b"), (r, "conv")]
    common, common_ours = interference.common_calls(shipped, ours)
    assert common == [True, False, False, True, False, False]
    assert common_ours == [True, False, False, True, False, False]
    # Two iterations of a prefill and two decode steps.
    times = interference.StepTimes(
        step=[10, 2, 3, 11, 2, 5],
        xnnpack=[6, 1, 1, 7, 1, 3],
        replaced=[1, 0, 0, 1, 0, 0],
        rustconv=[1, 0.5, 0.5, 1, 0.5, 0.5],
        other=[2, 0.5, 1.5, 2, 0.5, 1.5],
    )
    phases = interference.phase_medians(times, 3)
    assert phases["prefill"]["step"] == 10.5 and phases["decode"]["xnnpack"] == 1
    base = {"prefill": {p: 1.0 for p in interference.PARTS}, "decode": phases["decode"]}
    slower = {ph: {p: 1.1 * v for p, v in d.items()} for ph, d in base.items()}
    summary = interference.summarize(
        [{"shipped": base, "rustconv": slower}, {"shipped": slower, "rustconv": slower}],
        ["shipped", "rustconv"],
    )
    change = summary["prefill"]["rustconv"]["xnnpack_change"]
    assert change["min"] == pytest.approx(0) and change["max"] == pytest.approx(0.1)
    assert "xnnpack_change" not in summary["decode"]["shipped"]


def _timed_row(setting, alt, median, err=1e-6, peak=1.0, status="ok", **extra):
    row = alternatives.new_row(setting, alt)
    row.update(status=status, median_ms=median, iters=10, max_abs_err=err, peak_mib=peak)
    row.update(reference="eager" if err is not None else None, **extra)
    return row


def test_rounds_merge_keeps_the_best_round_and_every_rounds_checks():
    s = workload.Setting("zoo", 0, 0, None, None, "m", "small")
    merged = rounds.merge(
        [
            [_timed_row(s, "ours", 1.37, peak=2.0)],
            [_timed_row(s, "ours", 0.89, err=2e-3, note="slow start")],
            [_timed_row(s, "ours", 0.90, chosen_kernel="gemm")],
        ]
    )
    (row,) = merged
    # Timing from the least disturbed round, every median kept in order.
    assert row["median_ms"] == 0.89 and row["round_medians_ms"] == [1.37, 0.89, 0.90]
    assert row["rounds"] == 3 and row["spread"] == pytest.approx(1.37 / 0.89)
    # The worst error and peak memory of any round, whichever round is kept.
    assert row["max_abs_err"] == 2e-3 and row["peak_mib"] == 2.0
    assert row["status"] == "ok" and row["note"] == "slow start"
    # A broken output (NaN) or an error in any round is the row's.
    nan, err = rounds.merge(
        [
            [_timed_row(s, "ours", 1.0), _timed_row(s, "ours:gemm", 1.0)],
            [
                _timed_row(s, "ours", 0.9, err=float("nan")),
                _timed_row(s, "ours:gemm", 0.8, status="error: forced gemm but the plan chose fft"),
            ],
        ]
    )
    assert math.isnan(nan["max_abs_err"]) and nan["median_ms"] == 0.9
    assert err["status"].startswith("error: forced gemm") and err["median_ms"] == 1.0
    assert "round 2 of 2: error" in err["note"] and err["round_medians_ms"] == [1.0, 0.8]
    assert not report._ok(err)
    # Different plans in two rounds are noted.
    (diff,) = rounds.merge(
        [[_timed_row(s, "ours", 1.0, chosen_kernel=k)] for k in ("fft", "direct")]
    )
    assert "plans differ between rounds: direct, fft" in diff["note"]
    # One round: the row as measured, with its one median.
    (one,) = rounds.merge([[_timed_row(s, "xnnpack", 2.0)]])
    assert (one["median_ms"], one["rounds"], one["spread"]) == (2.0, 1, None)
    assert one["round_medians_ms"] == [2.0]


def test_rounds_repeat_only_finished_calls_within_the_budget():
    s = workload.Setting("blocks", 16, 64, None, None, "ssm")
    assert rounds.repeatable([_timed_row(s, "ours", 5.0)], budget_s=2.0)
    assert not rounds.repeatable([_timed_row(s, "ours", 2500.0)], budget_s=2.0)
    dnf = alternatives.new_row(s, "xnnpack")
    dnf.update(status="DNF", projected_s=100.0)
    assert not rounds.repeatable([dnf], budget_s=2.0)
    floor = alternatives.new_row(s, "io_floor")
    floor["median_ms"] = 0.01  # computed, not a run: no timed calls
    assert not rounds.repeatable([floor], budget_s=2.0)
    assert not rounds.repeatable([], budget_s=2.0)
    assert rounds.rounds_for("zoo", None) == 3 and rounds.rounds_for("conv", None) == 1
    assert rounds.rounds_for("conv", 5) == 5


def _zoo_rows(name, ours, ours_rounds, xnn, xnn_rounds):
    s = workload.Setting("zoo", 0, 0, None, None, name, "small")
    rows = []
    for alt, medians in (("ours", ours_rounds), ("xnnpack", xnn_rounds)):
        rows += rounds.merge([[_timed_row(s, alt, m)] for m in medians])
    assert rows[0]["median_ms"] == ours and rows[1]["median_ms"] == xnn
    return rows


def test_report_marks_failures_within_measured_noise(tmp_path):
    rows = [
        # 0.92x: the gap to the 0.95 bar (3%) is inside ours' round spread (8%).
        *_zoo_rows("noisy", 1.0, [1.08, 1.0, 1.02], 0.92, [0.92, 0.93, 0.925]),
        # 0.80x: 19% short of the bar, rounds within 1%: a real failure.
        *_zoo_rows("slow", 1.0, [1.0, 1.01, 1.005], 0.80, [0.80, 0.801, 0.802]),
        *_zoo_rows("fast", 1.0, [1.0, 1.3, 1.1], 1.2, [1.2, 1.2, 1.2]),
    ]
    analysis = report.analyze({}, rows)
    (xnn_goal, ort_goal) = analysis["zoo_goals"]
    assert xnn_goal.status == "FAIL" and ort_goal.status == "n/a"
    assert xnn_goal.detail == (
        "3 compared; slower: noisy (small) 0.92x (within measured noise: round spread ours "
        "8.0%, xnnpack 1.1%), slow (small) 0.80x; 1 of the 2 within measured noise"
    )
    assert "fast" not in xnn_goal.detail
    meta = {
        "date": "today", "machine": measure.machine_info(), "settings": "3 zoo", "threads": 1,
        "bandwidth_buffer_mib": 16, "command": "bench/run.py zoo", "mode": "quick", "git": "x",
        "torch": "t", "executorch": "e", "warmup": 2, "repeats": 7, "budget_s": 2.0,
        "time_limit_s": 60.0, "rounds": {"zoo": 3},
    }  # fmt: skip
    report.write_all(tmp_path, meta, rows, plots=False)
    summary = (tmp_path / "summary.md").read_text()
    assert "- **Rounds:** 3 for zoo. Per setting and thread count" in summary
    assert "| round spread ours / XNNPACK |" in summary and "| 8.0% / 1.1% |" in summary
    assert "| noisy (small) | 1 ms [8.0%] | 0.92 ms [1.1%] |" in summary  # all measurements
    with open(tmp_path / "results.csv") as f:
        noisy = next(csv.DictReader(f))
    assert noisy["round_medians_ms"] == "1.08;1;1.02" and noisy["rounds"] == "3"
    assert float(noisy["spread"]) == pytest.approx(1.08)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["rows"][0]["round_medians_ms"] == [1.08, 1.0, 1.02]


def test_rounds_interleave_alternatives(tmp_path, monkeypatch):
    """run.main measures a setting's alternatives in turn, round after round
    (A B C, A B C), with budget / R each; a computed row or a failed one is
    not repeated; SettingBench is built once per setting."""
    calls, built = [], []

    class FakeBench:
        def __init__(self, ctx, data):
            built.append(data.name)
            self.ctx, self.s = ctx, data

        def run(self, alt):
            calls.append((alt, self.ctx.threads, self.ctx.round_budget_s))
            if alt == "io_floor":
                row = alternatives.new_row(self.s, alt)
                row["median_ms"] = 0.01
                return [row]
            tries = sum(c[:2] == (alt, self.ctx.threads) for c in calls)
            if alt == "et_cpu" and tries == (2 if self.ctx.threads == 1 else 1):
                return [_timed_row(self.s, alt, 1.0, status="error: crashed")]
            # ours: slow in its first round (a throttled episode).
            return [_timed_row(self.s, alt, 3.0 if alt == "ours" and tries == 1 else 1.0)]

    class FakeNative:
        def __init__(self, cache_dir):
            pass

        def copy_bandwidth(self, mib, threads):
            return 1e10

    monkeypatch.setattr(alternatives, "SettingBench", FakeBench)
    monkeypatch.setattr(workload, "make_data", lambda setting, seed: setting)
    monkeypatch.setattr(run, "Native", FakeNative)
    monkeypatch.setattr(measure, "others_cpu_busy", lambda: 0.0)

    def bench(*extra):
        calls.clear()
        built.clear()
        out = tmp_path / f"out{len(extra)}"
        argv = [
            "block=ssm", "C=16", "N=64", "alt=ours,xnnpack,et_cpu,io_floor", "--no-plots",
            "--runner", __file__, "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
            "--budget", "3", "--threads", "1,2", *extra,
        ]  # fmt: skip
        assert run.main(argv) == 0
        with open(out / "results.csv") as f:
            return {(r["alternative"], r["threads"]): r for r in csv.DictReader(f)}

    rows = bench()  # blocks: 3 rounds by default
    assert built == ["ssm C=16 N=64"]
    # At 1 thread et_cpu fails in round 2; at 2 threads in round 1, then it is not repeated.
    one = ["ours", "xnnpack", "et_cpu", "io_floor"] + ["ours", "xnnpack", "et_cpu"] * 2
    two = ["ours", "xnnpack", "et_cpu", "io_floor"] + ["ours", "xnnpack"] * 2
    assert [c[0] for c in calls] == one + two
    assert [c[1] for c in calls] == [1] * len(one) + [2] * len(two)
    assert {c[2] for c in calls} == {1.0}
    ours = rows[("ours", "1")]
    assert float(ours["median_ms"]) == 1.0 and ours["round_medians_ms"] == "3;1;1"
    assert float(ours["spread"]) == 3.0
    assert rows[("io_floor", "2")]["rounds"] == "1"
    # An error in a later round is the row's, its best time kept beside it.
    et_cpu = rows[("et_cpu", "1")]
    assert et_cpu["status"] == "error: crashed" and et_cpu["round_medians_ms"] == "1;1;1"
    assert rows[("et_cpu", "2")]["rounds"] == "1" and rows[("xnnpack", "2")]["status"] == "ok"

    rows = bench("--rounds", "1")  # one measurement each, the whole budget: as before
    assert [c[0] for c in calls] == ["ours", "xnnpack", "et_cpu", "io_floor"] * 2
    assert {c[2] for c in calls} == {3.0}
    assert float(rows[("ours", "1")]["median_ms"]) == 3.0
    assert rows[("ours", "1")]["spread"] == ""


def test_runner_calls_planned_from_this_settings_own_time(tmp_path, monkeypatch):
    """A zoo model's first call is probed (its projection is only a nominal
    guard); at a second thread count its timed calls are planned from the
    first count's time, not the prior (which planned 4 timed calls of a 1 ms
    program at 2 threads)."""
    s = workload.Setting("zoo", 0, 0, None, None, "m", "small")
    data = SimpleNamespace(setting=s, zoo=SimpleNamespace(decode=False, module=object()))
    lowered = SimpleNamespace(
        pte=tmp_path / "m.pte", lower_s=1.0, describe=lambda: "RustConvBackend x1",
        calls=lambda backend: 1, delegated_to=lambda backend: True,
    )  # fmt: skip
    runs = []

    def run_pte(runner, pte, npz, out, warmup, iters, threads, timeout_s, *args, **kw):
        runs.append((iters, threads))
        timing = measure.Timing([1.0], warmup)
        return measure.RunnerResult(timing, 0.9, 1.1, 1.0, [], np.zeros(1), "")

    monkeypatch.setattr(alternatives, "inputs_npz", lambda data, seed, cache: tmp_path / "in.npz")
    monkeypatch.setattr(alternatives, "lowered_pte", lambda *a: lowered)
    monkeypatch.setattr(measure, "run_pte", run_pte)
    ctx = alternatives.Context(
        runner=Path("pte_runner"), baseline_runner=None, threads=1, warmup=2, repeats=7,
        time_limit_s=60.0, budget_s=2.0, seed=0, cache_dir=tmp_path, work_dir=tmp_path,
        native=None, projector=projection.Projector(1), ram_bytes=None, rounds=2,
    )  # fmt: skip
    bench = alternatives.SettingBench(ctx, data)
    (row,) = bench.run("xnnpack")
    # A probe call, then the plan for 1 ms calls in a second of budget per round.
    assert runs == [(1, 1), (measure.plan_repeats(1e-3, 2, 7, 1.0)[1], 1)]
    assert row["status"] == "ok" and row["iters"] == runs[1][0] >= 100
    runs.clear()
    bench.ctx = dataclasses.replace(ctx, threads=2, projector=projection.Projector(2))
    bench.run("xnnpack")
    assert runs == [(measure.plan_repeats(1e-3, 2, 7, 1.0)[1], 2)]
