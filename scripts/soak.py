"""Soak: long ``pte_runner -iter`` runs of the benchmark's block, decode and
zoo programs, their resident memory sampled, every iteration's outputs
checked against the first's (README, Tests). Run it through
``scripts/soak.sh [SECONDS] [options]``.

Programs are those ``bench/`` lowers (RustConv first, XNNPACK after it),
from its cache (``out/bench/cache``): by default the seven blocks at C=64,
N=256, the decode steps at the benchmark's widths (C=250 to 4096), and
every zoo model and LFM2 recipe at the tests' small size. The time is
shared equally between them; each runs in one pte_runner process with
``-reset_state -check_outputs``, so every iteration must give the first
iteration's outputs bit for bit: a state RustConv owns restarts at every
iteration, and so does the state ExecuTorch owns (the LFM2 recipes' KV
cache, Voxtral's streaming caches): ``-reset_state`` also puts pte_runner's
planned memory back as the method loaded it. ``--no-check`` soaks a
program's memory alone.

Memory: VmRSS from ``/proc/PID/status`` every ``--sample-s`` seconds. The
first ``WARMUP_FRACTION`` of a run (at least ``MIN_WARMUP_S``) is warm-up
(pools started, caches and allocator arenas filled); after it, the resident
memory must stay flat: the median of the last five samples may exceed the
median of the first five after warm-up by at most ``GROWTH_BOUND_KIB``
plus ``GROWTH_BOUND_FRACTION`` of it. A leak of a few hundred bytes a call
grows far past that over the hundreds of thousands of calls a run makes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WARMUP_FRACTION = 0.2
MIN_WARMUP_S = 1.0
GROWTH_BOUND_KIB = 1024
GROWTH_BOUND_FRACTION = 0.01
#: The bench filters of the default set, one group each.
DEFAULT_GROUPS = ("blocks C=64 N=256", "decode", "zoo size=small")


@dataclass
class Program:
    name: str
    pte: Path
    #: -inputs_npz_path, the calls of -steps_npz_paths, or none (pte_runner's
    #: random inputs).
    inputs: list[Path]


@dataclass
class Result:
    name: str
    iterations: int
    seconds: float
    checked: bool
    rss_kib: list[int] = field(default_factory=list)
    sample_s: list[float] = field(default_factory=list)
    warm_kib: int = 0
    end_kib: int = 0
    growth_kib: int = 0
    bound_kib: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def rss_kib(pid: int) -> int | None:
    """VmRSS of a running process, in KiB; None once it has gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def memory_verdict(times: list[float], samples: list[int]) -> tuple[int, int, int, str]:
    """(warm, end, growth, error) for a run's RSS samples (KiB) at `times`
    (seconds from its start); error is empty when memory stayed flat."""
    if not samples:
        return 0, 0, 0, "no memory samples (the run ended at once)"
    warmup = max(MIN_WARMUP_S, WARMUP_FRACTION * times[-1])
    after = [s for t, s in zip(times, samples, strict=True) if t >= warmup]
    if len(after) < 10:
        return 0, 0, 0, f"too few samples after {warmup:.1f} s of warm-up ({len(after)})"
    warm = int(statistics.median(after[:5]))
    end = int(statistics.median(after[-5:]))
    growth = end - warm
    bound = int(GROWTH_BOUND_KIB + GROWTH_BOUND_FRACTION * warm)
    error = ""
    if growth > bound:
        error = f"resident memory grew {growth} KiB after warm-up (bound {bound} KiB)"
    return warm, end, growth, error


def runner_command(
    runner: Path, program: Program, iterations: int, threads: int | None, check: bool
):
    cmd = [str(runner), "-model_path", str(program.pte), "-iter", str(iterations)]
    if len(program.inputs) == 1:
        cmd += ["-inputs_npz_path", str(program.inputs[0])]
    elif program.inputs:
        cmd += ["-steps_npz_paths", ",".join(map(str, program.inputs))]
    if check:
        cmd += ["-reset_state", "-check_outputs"]
    if threads:
        cmd += ["-num_threads", str(threads)]
    return cmd


def seconds_per_iteration(
    runner: Path, program: Program, threads: int | None, check: bool
) -> float:
    """An iteration's time from a short run's medians (pte_runner's
    ``latency:`` line; with several calls, the first call's and the
    others'). It leaves out what pte_runner does between calls (inputs
    copied in, outputs compared): calls of microseconds run longer than
    planned."""
    cmd = runner_command(runner, program, 5, threads, check) + ["-warmup", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(" ".join(run.stderr.strip().splitlines()[-1:]))
    # Medians: a short run's averages carry its first calls' outliers (pools
    # starting, pages faulted in), which made runs end with too few samples.
    line = r"^(latency|first call latency): p10 [0-9.]+ ms, p50 ([0-9.]+) ms"
    p50 = {name: float(ms) / 1e3 for name, ms in re.findall(line, run.stdout, re.M)}
    if "latency" not in p50:
        raise RuntimeError(f"no latency line in {run.stdout!r}")
    if len(program.inputs) > 1:
        return p50["first call latency"] + (len(program.inputs) - 1) * p50["latency"]
    return p50["latency"]


def soak_one(
    runner: Path,
    program: Program,
    seconds: float,
    threads: int | None,
    sample_s: float,
    check: bool = True,
) -> Result:
    """Runs `program` for about `seconds` and samples its memory."""
    try:
        per_iteration = seconds_per_iteration(runner, program, threads, check)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return Result(program.name, 0, 0.0, check, error=f"probe run failed: {e}")
    iterations = max(10, int(seconds / max(per_iteration, 1e-6)))
    cmd = runner_command(runner, program, iterations, threads, check)
    result = Result(program.name, iterations, 0.0, check)
    start = time.perf_counter()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        # Sampled until the process exits; its output is small, read after.
        while proc.poll() is None:
            kib = rss_kib(proc.pid)
            now = time.perf_counter() - start
            if kib is not None and proc.poll() is None:
                result.rss_kib.append(kib)
                result.sample_s.append(round(now, 3))
            # Three times the planned time: the run has stalled.
            if now > 3 * seconds + 60:
                proc.kill()
                result.error = f"still running after {now:.0f} s (planned {seconds:.0f} s)"
            time.sleep(sample_s)
        stdout, stderr = proc.communicate()
    result.seconds = round(time.perf_counter() - start, 2)
    if proc.returncode != 0 and not result.error:
        last = stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        result.error = last[0]
    if not result.error and check and "outputs checked:" not in stdout:
        result.error = "pte_runner did not report its output check"
    warm, end, growth, memory_error = memory_verdict(result.sample_s, result.rss_kib)
    result.warm_kib, result.end_kib, result.growth_kib = warm, end, growth
    result.bound_kib = int(GROWTH_BOUND_KIB + GROWTH_BOUND_FRACTION * warm)
    result.error = result.error or memory_error
    return result


def bench_programs(groups: list[str], cache_dir: Path, seed: int) -> list[Program]:
    """The programs bench/ lowers for these filter groups (``ours``)."""
    sys.path.insert(0, str(ROOT))
    from bench import lowering, workload
    from bench.run import parse_filters

    programs = []
    for group in groups:
        settings, _ = parse_filters(group.split(), full=False)
        for setting in settings:
            data = workload.make_data(setting, seed)
            print(f"soak: lowering {setting.name}", file=sys.stderr, flush=True)
            lowered = lowering.lowered_pte("ours", data, seed, cache_dir)
            if setting.kind == "zoo" and len(data.zoo.calls) > 1:
                inputs = lowering.steps_npz(data, seed, cache_dir)
            else:
                inputs = [lowering.inputs_npz(data, seed, cache_dir)]
            programs.append(Program(setting.name, lowered.pte, inputs))
    return programs


def describe(result: Result) -> str:
    mib = 1 / 1024
    verdict = "ok" if result.ok else f"FAIL: {result.error}"
    outputs = "outputs equal" if result.checked else "outputs not compared"
    return (
        f"{result.name:<36} {result.iterations:>8} it {result.seconds:>7.1f} s  "
        f"RSS warm {result.warm_kib * mib:7.1f} MiB end {result.end_kib * mib:7.1f} MiB "
        f"growth {result.growth_kib:>6} KiB (bound {result.bound_kib})  {outputs}  {verdict}"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "seconds",
        nargs="?",
        type=float,
        default=600.0,
        help="soak time in all, shared between the programs (default 600)",
    )
    p.add_argument(
        "--group",
        action="append",
        dest="groups",
        help=f"bench filters of one group of programs (repeatable; default: "
        f"{' / '.join(DEFAULT_GROUPS)})",
    )
    p.add_argument(
        "--pte",
        type=Path,
        help="soak this program alone (random inputs unless --inputs), instead of bench's",
    )
    p.add_argument("--inputs", type=Path, help="with --pte: its inputs npz")
    p.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="memory only: no -reset_state -check_outputs",
    )
    p.add_argument("--threads", type=int, help="pte_runner -num_threads (default: its own)")
    p.add_argument("--sample-s", type=float, default=0.25, help="RSS sampling period (0.25 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runner", type=Path, default=ROOT / "target" / "release" / "pte_runner")
    p.add_argument("--cache-dir", type=Path, default=ROOT / "out" / "bench" / "cache")
    p.add_argument("--out", type=Path, help="report JSON (default out/soak/<time>/report.json)")
    args = p.parse_args(argv)  # fmt: skip

    if args.pte:
        inputs = [args.inputs] if args.inputs else []
        programs = [Program(args.pte.stem, args.pte, inputs)]
    else:
        programs = bench_programs(args.groups or list(DEFAULT_GROUPS), args.cache_dir, args.seed)
    each = args.seconds / len(programs)
    print(
        f"soak: {len(programs)} program(s), {each:.1f} s each, threads {args.threads or 'default'}",
        flush=True,
    )
    results = []
    for program in programs:
        result = soak_one(args.runner, program, each, args.threads, args.sample_s, args.check)
        print(describe(result), flush=True)
        results.append(result)
    out = args.out or ROOT / "out" / "soak" / time.strftime("%Y%m%d-%H%M%S") / "report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in results], indent=1))
    failed = [r for r in results if not r.ok]
    iterations = sum(r.iterations for r in results if r.ok)
    worst = max(results, key=lambda r: r.growth_kib)
    print(
        f"soak: {len(results) - len(failed)} of {len(results)} program(s) flat and "
        f"{'equal' if not failed else 'checked'}, {iterations} iterations, largest growth "
        f"{worst.growth_kib} KiB ({worst.name}); report {out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
