"""Timing, peak memory and pte_runner runs, measured the same way for every
alternative.

* Latency percentiles are by nearest rank over the timed calls (pte_runner's
  definition): p50 is the median.
* Peak memory is what running an alternative adds above its inputs: the
  process's resident high-water mark (``VmHWM``) after the runs minus its
  resident size (``VmRSS``) just after resetting the mark (``clear_refs`` 5)
  with the inputs already allocated. pte_runner does exactly this around
  loading and running the program; in-process alternatives do it around
  building their weights/state and running.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rustconv.devtools import pte_runner


@dataclass
class Timing:
    samples_ms: list[float]
    warmup: int
    note: str = ""

    def pct(self, p: float) -> float:
        ms = sorted(self.samples_ms)
        return ms[min(max(math.ceil(p / 100 * len(ms)), 1), len(ms)) - 1]

    @property
    def median_ms(self) -> float:
        return self.pct(50)


#: Most timed calls a measurement takes (see plan_repeats).
MAX_REPEATS = 200


def plan_repeats(projected_s: float, warmup: int, repeats: int, budget_s: float) -> tuple[int, int]:
    """Warm-ups and timed calls for one measurement.

    Short calls get more than ``repeats`` timed calls, up to ``MAX_REPEATS``
    within a quarter of ``budget_s``, and a tenth as many warm-ups: the
    median of a handful of microsecond calls mostly measures warm-up
    (thread wake-ups, cold caches). Slow calls get fewer, cut so the timed
    calls fit about ``budget_s`` (but at least 3 of them, or 1 when a single
    call is longer than the budget), and one warm-up for calls over a
    second."""
    if projected_s <= 0:
        return warmup, repeats
    fit = int(budget_s / projected_s)
    floor = 1 if projected_s > budget_s else min(3, repeats)
    wanted = max(repeats, min(MAX_REPEATS, int(0.25 * budget_s / projected_s)))
    reps = max(floor, min(wanted, fit))
    warm = max(warmup, reps // 10) if projected_s < 1.0 else min(warmup, 1)
    return warm, reps


def time_calls(
    fn: Callable[[], object],
    warmup: int,
    repeats: int,
    time_limit_s: float,
    budget_s: float,
) -> tuple[Timing, object]:
    """Times ``fn`` with time.perf_counter. The first call is a warm-up whose
    duration sets the counts (see plan_repeats); if it alone exceeds the time
    limit it is the only sample. Returns the timing and the last result."""
    t0 = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t0
    if first > time_limit_s:
        note = f"one call only: it took {first:.1f} s (> time limit {time_limit_s:g} s)"
        return Timing([first * 1e3], 0, note), result
    warm, reps = plan_repeats(first, warmup, repeats, budget_s)
    for _ in range(max(warm - 1, 0)):
        result = fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(samples, max(warm, 1)), result


# Memory ---------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    return (_status_kib("VmRSS:") or 0) * 1024


_libc = None


def _trim_heap() -> None:
    """Returns freed heap pages to the OS so earlier work does not hide in
    the baseline (glibc only; a no-op elsewhere)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """``with PeakMemory() as m: ...`` then ``m.mib``: VmHWM after minus VmRSS
    at the (reset) start, in MiB; None where /proc does not allow it."""

    def __init__(self):
        self.baseline_kib: int | None = None
        self.mib: float | None = None

    def __enter__(self):
        gc.collect()
        _trim_heap()
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.baseline_kib = _status_kib("VmRSS:")
        except OSError:
            self.baseline_kib = None
        return self

    def __exit__(self, *exc):
        peak = _status_kib("VmHWM:")
        if self.baseline_kib is not None and peak is not None:
            self.mib = max(peak - self.baseline_kib, 0) / 1024
        return False


# pte_runner -------------------------------------------------------------------
# Flags, the run and its output's parsing are rustconv's one driver
# (rustconv.devtools.pte_runner, which python -m rustconv.profile also uses);
# this keeps the benchmark's view of a run: a Timing, the output array.

PlanLine = pte_runner.PlanLine
parse_plan_lines = pte_runner.parse_plan_lines
RunnerError = pte_runner.RunnerError
RunnerTimeout = pte_runner.RunnerTimeout


@dataclass
class RunnerResult:
    timing: Timing
    p10_ms: float
    p90_ms: float
    peak_mib: float | None
    plans: list[PlanLine]
    output: np.ndarray
    stderr: str


def run_pte(
    runner: Path,
    pte: Path,
    inputs_npz: Path,
    out_npz: Path,
    warmup: int,
    iters: int,
    threads: int,
    timeout_s: float,
    etdump: Path | None = None,
    steps: list[Path] | None = None,
    extra: list[str] | None = None,
    keep_etdump: bool = False,
    env: dict[str, str] | None = None,
    decode_steps: int | None = None,
) -> RunnerResult:
    """Runs pte_runner once and parses its latency, peak memory, plan lines
    and output 0; with ``etdump``, the run is traced into that file (then
    removed, unless ``keep_etdump``); ``extra``: more pte_runner arguments.
    With ``steps``, ``inputs_npz`` is not used: the calls run in that order,
    state carried (``-steps_npz_paths``), the latency is the calls' after
    the first (decode steps) and the output the last step's; ``decode_steps``
    repeats the last step until there are that many (pte_runner's
    ``-decode_steps``), their output not read. ``env``: more environment
    variables for the run."""
    out_npz.unlink(missing_ok=True)
    args = pte_runner.runner_args(
        pte,
        iters=iters,
        warmup=warmup,
        threads=threads,
        inputs=None if steps else inputs_npz,
        steps=steps,
        outputs=out_npz,
        etdump=etdump,
        extra=[*(extra or ()), *(["-decode_steps", str(decode_steps)] if decode_steps else [])],
    )
    run = pte_runner.run(args, runner=[str(runner)], timeout_s=timeout_s, env=env)
    lat = pte_runner.parse_latency(run.stdout)
    if lat is None:
        raise RunnerError("no latency line in pte_runner output")
    written = out_npz.with_name(f"{out_npz.stem}.{len(steps) - 1}.npz") if steps else out_npz
    with np.load(written) as outputs:
        output = outputs["0"]
    for k in range(max(len(steps), (decode_steps or 0) + 1) if steps else 0):
        out_npz.with_name(f"{out_npz.stem}.{k}.npz").unlink(missing_ok=True)
    out_npz.unlink(missing_ok=True)
    if etdump is not None:
        if not etdump.is_file():
            raise RunnerError(f"pte_runner wrote no ETDump at {etdump}")
        if not keep_etdump:
            etdump.unlink()
    # pte_runner reports percentiles, not samples: keep the median as the one
    # sample Timing needs.
    return RunnerResult(
        timing=Timing([lat.p50_ms], warmup),
        p10_ms=lat.p10_ms,
        p90_ms=lat.p90_ms,
        peak_mib=pte_runner.parse_peak_mib(run.stdout),
        plans=parse_plan_lines(run.stderr + run.stdout),
        output=output,
        stderr=run.stderr,
    )


# Machine ----------------------------------------------------------------------


def machine_info() -> dict:
    """CPU model, logical/usable CPUs, physical cores and RAM, from /proc."""
    info = {
        "cpu_model": "unknown",
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "physical_cores": None,
        "ram_gib": None,
    }
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    if models:
        info["cpu_model"] = models[0].strip()
    cores = set()
    for block in cpuinfo.split("\n\n"):
        pid = re.search(r"^physical id\s*:\s*(\d+)", block, re.M)
        cid = re.search(r"^core id\s*:\s*(\d+)", block, re.M)
        if pid and cid:
            cores.add((pid.group(1), cid.group(1)))
    info["physical_cores"] = len(cores) or None
    ram = ram_bytes()
    info["ram_gib"] = ram / 2**30 if ram else None
    return info


def _cpu_times() -> tuple[int, int] | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks[:8]), idle


def others_cpu_busy(seconds: float = 1.0) -> float | None:
    """Fraction of all CPUs busy over ``seconds`` while this process sleeps:
    how much other work competes with the benchmark."""
    before = _cpu_times()
    time.sleep(seconds)
    after = _cpu_times()
    if not before or not after or after[0] == before[0]:
        return None
    total = after[0] - before[0]
    return 1.0 - (after[1] - before[1]) / total


def ram_bytes() -> int | None:
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    total = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.M)
    return int(total.group(1)) * 1024 if total else None
