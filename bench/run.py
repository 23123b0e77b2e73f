"""RustConv benchmark: our backend against XNNPACK, ExecuTorch's CPU kernels,
PyTorch eager, PyTorch FFT convolution and a plain C scan, on causal
depthwise conv1d and linear-scan settings. Usually run through
scripts/bench.sh, which builds pte_runner first.

Filters replace the matrix's values for one dimension (comma-separated) or
pick workloads and alternatives, e.g.::

    bench/run.py --quick conv K=4,N           # quick shapes, two filter lengths
    bench/run.py --full C=2048 N=65536 scan   # one scan setting
    bench/run.py C=8 N=64 K=4                 # any shape, not only the matrix's
    bench/run.py --quick alt=ours,xnnpack     # only these alternatives
    bench/run.py blocks                       # the reference blocks at the issue's sizes
    bench/run.py blocks C=16 N=64 block=ssm   # tiny sizes, one block
    bench/run.py decode                       # one-token calls with state carried
    bench/run.py zoo                          # whole upstream models (tests/zoo), full size
    bench/run.py zoo size=small model=ta_wav2letter_mfcc,et_silero_vad
    bench/run.py interference --rounds 7     # XNNPACK's own time with and without us

Blocks run only when named (``blocks`` or ``block=..``); C= and N= then
replace every block's width and length. Decode steps (one token per call,
state carried; run as blocks) likewise: ``decode`` or ``block=decode_..``.
The zoo too: ``zoo`` or ``model=..``, at ``size=full`` (default) or ``small``.
``interference`` is a measurement of its own (bench/interference.py): the
LFM2 recipes' XNNPACK, RustConv and other event times per step, from the
profile, as shipped and with RustConv at several RustConv thread counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "partitioner_py")]

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench import alternatives, measure, report, rounds, workload  # noqa: E402
from bench.native import Native  # noqa: E402
from bench.projection import Projector  # noqa: E402

ALL_ALTERNATIVES = (
    "ours",
    "ours_unfused",
    "candidates",
    "xnnpack",
    "et_cpu",
    "onnxruntime",
    "eager",
    "torch_fft",
    "c_scan",
    "io_floor",
)
#: Run only when named (alt=..): the runtime's own overheads, beside ours.
OPT_IN_ALTERNATIVES = ("ours_traced", "ours_baseline")


def parse_filters(tokens: list[str], full: bool) -> tuple[list[workload.Setting], tuple[str, ...]]:
    kinds: list[str] = []
    cs = workload.FULL_C if full else workload.QUICK_C
    ns = workload.FULL_N if full else workload.QUICK_N
    ks = workload.FULL_K if full else workload.QUICK_K
    alts = ALL_ALTERNATIVES
    blocks = tuple(workload.BLOCKS)
    decode = tuple(workload.DECODE_BLOCKS)
    zoo_models: tuple[str, ...] | None = None  # None: every zoo entry
    zoo_size = "full"
    block_c = block_n = None  # explicit C= / N= also size the blocks
    for token in tokens:
        if token in workload.KINDS:
            kinds.append(token)
            continue
        key, sep, value = token.partition("=")
        values = [v.strip() for v in value.split(",") if v.strip()]
        if not sep or not values:
            raise SystemExit(
                f"bad filter {token!r}: use conv, scan, blocks, decode, zoo, C=.., N=.., K=.., "
                "block=.., model=.., size=.., alt=.."
            )
        try:
            if key == "C":
                cs = block_c = tuple(int(v) for v in values)
            elif key == "N":
                ns = block_n = tuple(int(v) for v in values)
            elif key == "K":
                ks = tuple("N" if v.upper() == "N" else str(int(v)) for v in values)
            elif key == "alt":
                # ours:NAME forces one conv algorithm (any workload, blocks too).
                forced = tuple(
                    v
                    for v in values
                    if v.startswith("ours:") and v[5:] in alternatives.KNOWN_ALGORITHMS
                )
                known = ALL_ALTERNATIVES + OPT_IN_ALTERNATIVES
                unknown = set(values) - set(known) - set(forced)
                if unknown:
                    raise SystemExit(
                        f"unknown alternative(s) {sorted(unknown)}: {known}"
                        f" or ours:NAME, NAME one of {alternatives.KNOWN_ALGORITHMS}"
                    )
                alts = tuple(a for a in known if a in values) + forced
            elif key == "block":
                known = (*workload.BLOCKS, *workload.DECODE_BLOCKS)
                unknown = set(values) - set(known)
                if unknown:
                    raise SystemExit(f"unknown block(s) {sorted(unknown)}: {known}")
                blocks = tuple(b for b in workload.BLOCKS if b in values)
                decode = tuple(b for b in workload.DECODE_BLOCKS if b in values)
                for kind, named in (("blocks", blocks), ("decode", decode)):
                    if named and kind not in kinds:
                        kinds.append(kind)
                if not blocks and "blocks" in kinds:
                    kinds.remove("blocks")
            elif key == "model":
                from bench import zoo

                known = zoo.names()
                unknown = set(values) - set(known)
                if unknown:
                    raise SystemExit(f"unknown zoo model(s) {sorted(unknown)}: {known}")
                zoo_models = tuple(m for m in known if m in values)
                if "zoo" not in kinds:
                    kinds.append("zoo")
            elif key == "size":
                if values not in (["full"], ["small"]):
                    raise SystemExit(f"size= is full or small, not {value!r}")
                zoo_size = values[0]
            else:
                raise SystemExit(f"unknown filter key {key!r} in {token!r}")
        except ValueError as e:
            raise SystemExit(f"bad filter {token!r}: {e}") from e
    if any(v <= 0 for v in (*cs, *ns)) or any(k != "N" and int(k) <= 0 for k in ks):
        raise SystemExit("C, N and K must be positive")
    if "zoo" in kinds and zoo_models is None:
        from bench import zoo

        zoo_models = tuple(zoo.names())
    settings = workload.make_settings(
        tuple(kinds) or workload.DEFAULT_KINDS, cs, ns, ks, blocks, block_c, block_n, decode,
        zoo_models or (), zoo_size,
    )  # fmt: skip
    return settings, alts


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="quick subset (the default)")
    size.add_argument("--full", action="store_true", help="the whole matrix (70 settings)")
    p.add_argument(
        "filters",
        nargs="*",
        help="conv | scan | blocks | decode | zoo | C=.. | N=.. | K=..(or N) | block=.. | "
        "model=.. | size=full|small | alt=..",
    )
    cores = len(os.sched_getaffinity(0))
    p.add_argument(
        "--threads",
        type=_thread_counts,
        default=[cores],
        help=f"threads (default {cores}); a list (1,2) runs every setting at each count in "
        "turn, in one run, each row named with its count",
    )
    p.add_argument("--out", type=Path, help="output dir (default out/bench/<timestamp>)")
    p.add_argument("--cache-dir", type=Path, default=ROOT / "out" / "bench" / "cache")
    p.add_argument("--runner", type=Path, default=None, help="pte_runner ($PTE_RUNNER)")
    p.add_argument(
        "--baseline-runner",
        type=Path,
        default=None,
        help="another pte_runner build (e.g. of an earlier commit) for alt=ours_baseline: "
        "the same programs, to measure what a runtime change costs",
    )
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (quick 2, full 3)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls (quick 7, full 20)")
    p.add_argument("--time-limit", type=float, default=60.0, help="s per call before DNF")
    p.add_argument(
        "--budget", type=float, default=None, help="s of timed calls per row (quick 2, full 10)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bandwidth-mib", type=int, default=512, help="copy probe buffer size")
    p.add_argument("--ram-gib", type=float, help="RAM to plan against (default: MemTotal)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--planned-inputs",
        action="store_true",
        help="lower with ExecuTorch's default input planning (pte_runner then holds a copy "
        "of the inputs in planned memory); default: inputs are read in place",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds: each alternative of a setting measured once per round, in "
        "turn, with budget/R each; the row is the round with the lowest median (default 3 "
        "for blocks, decode and zoo settings, 1 for conv and scan; interference: 5)",
    )
    p.add_argument(
        "--rustconv-threads",
        type=_thread_counts,
        default=None,
        help="interference: RustConv's own thread counts besides --threads' (default 1)",
    )
    args = p.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.full else 2)
    args.repeats = args.repeats if args.repeats is not None else (20 if args.full else 7)
    args.budget = args.budget if args.budget is not None else (10.0 if args.full else 2.0)
    if min(args.threads) < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--threads and --repeats must be >= 1, --warmup >= 0")
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def _thread_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--threads: {e}") from e
    if not counts:
        raise argparse.ArgumentTypeError("--threads needs at least one count")
    return counts


def _describe(settings: list[workload.Setting]) -> str:
    parts = []
    for kind in workload.KINDS:
        group = [s for s in settings if s.kind == kind]
        if not group:
            continue
        text = f"{len(group)} {kind}: C in {sorted({s.C for s in group})}, "
        text += f"N in {sorted({s.N for s in group})}"
        if kind in ("blocks", "zoo"):
            parts.append(f"{len(group)} {kind}: " + ", ".join(s.name for s in group))
            continue
        if kind == "conv":
            labels = sorted({s.K_label for s in group}, key=lambda k: (k == "N", len(k), k))
            text += f", K in [{', '.join(labels)}]"
        parts.append(text)
    return "; ".join(parts)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def git_describe() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    interference = "interference" in args.filters
    settings, alts = parse_filters([] if interference else args.filters, args.full)
    runner = args.runner or Path(
        os.environ.get("PTE_RUNNER", ROOT / "target" / "release" / "pte_runner")
    )
    if not runner.is_file():
        raise SystemExit(f"pte_runner not found at {runner}: build with scripts/setup.sh")
    args.runner_path = runner
    if "ours_baseline" in alts and not (args.baseline_runner and args.baseline_runner.is_file()):
        raise SystemExit("alt=ours_baseline needs --baseline-runner PATH (a pte_runner build)")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "out" / "bench" / stamp
    out.mkdir(parents=True, exist_ok=True)
    work_dir = out / "tmp"
    work_dir.mkdir(exist_ok=True)
    args.cache_dir.mkdir(parents=True, exist_ok=True)

    threads = args.threads
    torch.set_num_threads(max(threads))
    native = Native(args.cache_dir)
    print(
        f"measuring copy bandwidth ({args.bandwidth_mib} MiB, {max(threads)} threads)",
        file=sys.stderr,
    )
    bandwidth = native.copy_bandwidth(args.bandwidth_mib, max(threads))

    meta = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "others_busy_start": measure.others_cpu_busy(),
        "machine": measure.machine_info(),
        "threads": threads[0] if len(threads) == 1 else ", ".join(map(str, threads)),
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_buffer_mib": args.bandwidth_mib,
        "mode": "full" if args.full else "quick",
        "filters": args.filters,
        "settings": _describe(settings),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "budget_s": args.budget,
        "time_limit_s": args.time_limit,
        "seed": args.seed,
        "planned_inputs": args.planned_inputs,
        "git": git_describe(),
        "torch": torch.__version__,
        "executorch": _version("executorch"),
        "runner": str(runner),
        "baseline_runner": str(args.baseline_runner) if args.baseline_runner else None,
        "command": " ".join(["bench/run.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    if interference:
        from bench import interference as interference_bench

        args.rounds = args.rounds or 5
        try:
            return interference_bench.main(args, meta, out, work_dir)
        finally:
            for leftover in work_dir.glob("*"):
                leftover.unlink()
            work_dir.rmdir()
    ctx = alternatives.Context(
        runner=runner,
        baseline_runner=args.baseline_runner,
        threads=threads[0],
        warmup=args.warmup,
        repeats=args.repeats,
        time_limit_s=args.time_limit,
        budget_s=args.budget,
        seed=args.seed,
        cache_dir=args.cache_dir,
        work_dir=work_dir,
        native=native,
        projector=Projector(threads[0]),
        ram_bytes=int(args.ram_gib * 2**30) if args.ram_gib else measure.ram_bytes(),
        planned_inputs=args.planned_inputs,
        bandwidth=bandwidth,
    )

    # Every setting's data is built once; each thread count then runs its
    # alternatives (a context, with its own projections, per count) in
    # interleaved rounds (bench/rounds.py): every alternative once per round,
    # in turn, each round with budget / R of timed calls.
    meta["rounds"] = {
        kind: rounds.rounds_for(kind, args.rounds)
        for kind in dict.fromkeys(s.kind for s in settings)
    }
    contexts = {t: dataclasses.replace(ctx, threads=t, projector=Projector(t)) for t in threads}
    total = sum(
        rounds.rounds_for(s.kind, args.rounds) * len(alternatives.steps_for(s, alts))
        for s in settings
    ) * len(threads)
    rows: list[dict] = []
    bar = tqdm(total=total, unit="run", dynamic_ncols=True, file=sys.stderr)
    for setting in settings:
        try:
            bench = alternatives.SettingBench(ctx, workload.make_data(setting, args.seed))
        except Exception as e:
            bench, error = None, f"error: inputs: {alternatives.one_line(e)}"
        steps = alternatives.steps_for(setting, alts)
        count_rounds = rounds.rounds_for(setting.kind, args.rounds)
        for count in threads:
            runs: dict[str, list[list[dict]]] = {alt: [] for alt in steps}
            count_ctx = dataclasses.replace(contexts[count], rounds=count_rounds)
            for k in range(count_rounds):
                for alt in steps:
                    suffix = f" {count}T" if len(threads) > 1 else ""
                    if count_rounds > 1:
                        suffix += f" round {k + 1}/{count_rounds}"
                    bar.set_postfix_str(f"{setting.name} {alt}{suffix}")
                    if k and not rounds.repeatable(runs[alt][0], args.budget):
                        bar.update()  # its first round stands (bench/rounds.py)
                        continue
                    if bench is None:
                        new = [alternatives.new_row(setting, alt)]
                        new[0]["status"] = error
                    else:
                        bench.ctx = count_ctx
                        torch.set_num_threads(count)
                        new = bench.run(alt)
                    runs[alt].append(new)
                    bar.update()
            for alt in steps:
                for row in rounds.merge(runs[alt]):
                    row["threads"] = count
                    if len(threads) > 1:
                        row["setting"] = f"{row['setting']} @ {count} threads"
                    rows.append(row)
        bench = None
        report.write_rows(out, meta, rows)  # partial results survive a crash
    bar.close()

    meta["elapsed_s"] = time.perf_counter() - started
    meta["others_busy_end"] = measure.others_cpu_busy()
    report.write_all(out, meta, rows, plots=not args.no_plots)
    for leftover in work_dir.glob("*"):
        leftover.unlink()
    work_dir.rmdir()
    print(f"results in {out} ({meta['elapsed_s']:.0f} s)", file=sys.stderr)
    print(json.dumps({"out": str(out), "rows": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
