"""``python -m rustconv.profile model.pte``: where a program's time goes, per fused kernel.

Runs the program in ``pte_runner`` (:mod:`rustconv.devtools.pte_runner`) with
an ETDump (or reads an ETDump made elsewhere, ``--etdump``: profile on the
phone, read on the workstation),
reads it with ExecuTorch's Inspector (:mod:`rustconv.devtools.trace`) and reports,
for every RustConv fused kernel, the median and p90 time, its share of the
whole method, the algorithm, the bytes it moved and the GB/s they imply,
FLOP/s where meaningful, and the fraction of this machine's copy bandwidth
(measured on the spot, with as many threads as the run); beside them, the
other delegates' calls and the ops no delegate took. ``--json`` writes every
field, ``--png`` a chart of the time per kernel stacked per delegate call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rustconv.backend_id import BACKEND_ID
from rustconv.devtools.pte_runner import WARMUP, run_pte, runner_args
from rustconv.devtools.trace import Profile, read_profile

__all__ = [
    "copy_bandwidth_gbps",
    "main",
    "name_ops_from_plan",
    "profile_pte",
    "report",
    "run_pte",
    "runner_args",
]

_COPY_BYTES = 256 << 20


def name_ops_from_plan(profile: Profile, pte: bytes) -> None:
    """Fills the original ops of RustConv kernels that the trace left unnamed
    (no ETRecord) from the program's own plan (:mod:`rustconv.devtools.inspect`): the
    n-th RustConv call of the trace is the n-th RustConv delegate of the
    program (one method, calls in instruction order)."""
    from rustconv.devtools.inspect import delegate_calls, plan_blob

    ours = [c for c in profile.calls if c.backend == BACKEND_ID]
    if not any(not k.op_types for c in ours for k in c.kernels):
        return
    delegates = delegate_calls(pte)
    if len(delegates) != len(ours):
        return  # several methods, or a trace of another program: leave them unnamed
    for call, delegate in zip(ours, delegates, strict=True):
        plan = plan_blob(delegate.blob, delegate.compile_specs)
        absorbed = {k["kernel"]: [a["op"] for a in k["absorbed"]] for k in plan["kernels"]}
        for kernel in call.kernels:
            if not kernel.op_types:
                kernel.op_types = absorbed.get(kernel.kernel, [])


def copy_bandwidth_gbps(threads: int | None = None, nbytes: int = _COPY_BYTES) -> float:
    """This machine's copy bandwidth in GB/s (bytes read + written per
    second), best of a few copies of ``nbytes`` split over ``threads``."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    threads = threads or os.cpu_count() or 1
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(p[0], p[-1] + 1) for p in parts if p.size]

    def copy(bound: tuple[int, int]) -> None:
        np.copyto(dst[bound[0] : bound[1]], src[bound[0] : bound[1]])

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(5):
            start = time.perf_counter()
            list(pool.map(copy, bounds))
            best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p90(xs: list[float]) -> float | None:
    if not xs:
        return None
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _short(op: str) -> str:
    """``aten.convolution.default`` -> ``convolution``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


def report(profile: Profile, copy_gbps: float | None) -> dict[str, Any]:
    """The profile as rows: every RustConv kernel and every other event,
    in execution order, with the derived figures."""
    method_ms = _median(profile.method_ms)

    def timing(times: list[float]) -> dict[str, Any]:
        median = _median(times)
        return {
            "median_ms": median,
            "mean_ms": statistics.fmean(times) if times else None,
            "p90_ms": _p90(times),
            "share": median / method_ms if median is not None and method_ms else None,
            "iterations": len(times),
            "times_ms": times,
        }

    rows: list[dict[str, Any]] = []
    for kind, index in profile.order:
        if kind == "op":
            op = profile.ops[index]
            rows.append({"kind": "operator", "name": op.name, "op_types": op.op_types,
                         **timing(op.times_ms)})  # fmt: skip
            continue
        call = profile.calls[index]
        # Without an ETRecord the Inspector names no other delegate.
        name = f"{call.backend or 'other delegate'} call {call.index}"
        rows.append({"kind": "delegate_call", "call": call.index, "backend": call.backend,
                     "name": name, "op_types": call.op_types,
                     **timing(call.times_ms)})  # fmt: skip
        for inner in call.inner:
            rows.append({"kind": "delegated_op", "call": call.index, "backend": call.backend,
                         "name": inner.name, "op_types": inner.op_types,
                         **timing(inner.times_ms)})  # fmt: skip
        for k in call.kernels:
            row = {"kind": "kernel", "call": call.index, "backend": BACKEND_ID,
                   "kernel": k.kernel, "name": f"kernel {k.kernel}", "algorithm": k.algorithm,
                   "op_types": k.op_types, **timing(k.times_ms)}  # fmt: skip
            moved = _median([b for b in k.bytes if b is not None])
            flops = _median([f for f in k.flops if f is not None])
            seconds = row["median_ms"] / 1e3 if row["median_ms"] else None
            row["bytes"] = int(moved) if moved is not None else None
            row["flops"] = int(flops) if flops is not None else None
            row["gbps"] = moved / seconds / 1e9 if moved is not None and seconds else None
            row["gflops"] = flops / seconds / 1e9 if flops is not None and seconds else None
            row["copy_fraction"] = (
                row["gbps"] / copy_gbps if row["gbps"] is not None and copy_gbps else None
            )
            rows.append(row)
    kernels_ms = sum(r["median_ms"] or 0 for r in rows if r["kind"] == "kernel")
    return {
        "method": {**timing(profile.method_ms), "share": 1.0 if method_ms else None},
        "copy_bandwidth_gbps": copy_gbps,
        "rustconv_kernels_ms": kernels_ms,
        "rows": rows,
    }


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(doc: dict[str, Any]) -> str:
    method = doc["method"]
    copy = doc["copy_bandwidth_gbps"]
    lines = [
        f"method: median {_fmt(method['median_ms'], '.3f')} ms, p90 "
        f"{_fmt(method['p90_ms'], '.3f')} ms over {method['iterations']} iteration(s); "
        f"copy bandwidth {_fmt(copy, '.1f')} GB/s",
        f"{'':<2}{'event':<36}{'median ms':>10}{'p90 ms':>10}{'share':>7}  {'algorithm':<16}"
        f"{'MB moved':>9}{'GB/s':>7}{'%copy':>6}{'GFLOP/s':>8}  ops",
    ]
    for r in doc["rows"]:
        indent = "    " if r["kind"] in ("kernel", "delegated_op") else ""
        share = _fmt(r["share"] * 100 if r["share"] is not None else None, ".1f")
        ops = ", ".join(dict.fromkeys(_short(o) for o in r["op_types"]))
        if r["kind"] == "delegate_call" and r["backend"] == BACKEND_ID:
            ops = ""  # its kernels list them
        if r["kind"] == "kernel":
            extra = (
                f"{r['algorithm'] or '-':<16}{_fmt(r['bytes'] and r['bytes'] / 1e6, '.2f'):>9}"
                f"{_fmt(r['gbps'], '.1f'):>7}"
                f"{_fmt(r['copy_fraction'] and r['copy_fraction'] * 100, '.0f'):>6}"
                f"{_fmt(r['gflops'], '.1f'):>8}"
            )
        else:
            extra = f"{'':<16}{'':>9}{'':>7}{'':>6}{'':>8}"
        name = (indent + r["name"])[:35]
        lines.append(
            f"  {name:<36}{_fmt(r['median_ms'], '.3f'):>10}{_fmt(r['p90_ms'], '.3f'):>10}"
            f"{share + '%':>7}  {extra}  {ops}"
        )
    return "\n".join(lines)


def chart(doc: dict[str, Any], path: Path, title: str) -> None:
    """Mean time per kernel, stacked per delegate call (in grey: the rest of
    the call's time; means, unlike medians, add up); other delegates' calls
    and non-delegated ops as single grey bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: list[tuple[str, list[tuple[str, float]]]] = []
    current: list[tuple[str, float]] | None = None
    for r in doc["rows"]:
        ms = r["mean_ms"] or 0.0
        if r["kind"] == "delegate_call":
            label = f"{r['backend'].replace('Backend', '')} {r['call']}"
            current = []
            bars.append((label, current))
            if r["backend"] != BACKEND_ID:
                current.append(("call", ms))

        elif r["kind"] == "kernel" and current is not None:
            ops = "+".join(dict.fromkeys(_short(o) for o in r["op_types"]))
            label = f"RustConv {r['call']} k{r['kernel']} {r['algorithm']}: {ops}"
            current.append((label[:70], ms))
        elif r["kind"] == "operator":
            bars.append((r["name"][:20], [("op", ms)]))
    for label, segments in bars:
        if label.startswith("RustConv"):
            call = int(label.split()[-1])
            total = next(
                r["mean_ms"] or 0.0
                for r in doc["rows"]
                if r["kind"] == "delegate_call" and r["call"] == call
            )
            segments.append(("call", max(total - sum(ms for _, ms in segments), 0.0)))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(bars) + 4), 5))
    cmap = plt.get_cmap("tab20")
    color = 0
    for x, (_, segments) in enumerate(bars):
        bottom = 0.0
        for name, ms in segments:
            rust = name not in ("call", "op")
            ax.bar(x, ms, bottom=bottom, color=cmap(color % 20) if rust else "0.6",
                   edgecolor="white", label=name if rust else None)  # fmt: skip
            if rust:
                color += 1
            bottom += ms
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=30, ha="right")
    ax.set_ylabel("mean time per iteration (ms)")
    ax.set_title(title)
    if color:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def profile_pte(
    pte: Path,
    inputs: Path | None = None,
    iters: int = 20,
    threads: int | None = None,
    etrecord: Path | None = None,
    etdump: Path | None = None,
    measure_copy: bool = True,
) -> dict[str, Any]:
    """Runs (unless ``etdump`` names an existing trace) and reports; the
    document :func:`main` prints and writes."""
    with tempfile.TemporaryDirectory() as tmp:
        trace, warmup = etdump, 0
        if trace is None or not trace.exists():
            trace, warmup = etdump or Path(tmp) / "profile.etdump", WARMUP
            run_pte(pte, trace, inputs, iters, threads, warmup)
        profile = read_profile(trace, etrecord)
        profile.drop_first(warmup)
    name_ops_from_plan(profile, pte.read_bytes())
    copy = copy_bandwidth_gbps(threads) if measure_copy else None
    doc = report(profile, copy)
    doc["pte"] = str(pte)
    doc["threads"] = threads
    doc["profile"] = asdict(profile)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rustconv.profile", description=__doc__)
    parser.add_argument("pte", type=Path, help="the .pte program")
    parser.add_argument("--inputs", type=Path, help='inputs as an npz of arrays "0", "1", ...')
    parser.add_argument("--iter", type=int, default=20, help="timed iterations (default 20)")
    parser.add_argument("--threads", type=int, help="threads (default: all cores)")
    parser.add_argument("--etrecord", type=Path, help="the ETRecord saved at export (op names)")
    parser.add_argument(
        "--etdump", type=Path, help="read this ETDump instead of running (written if absent)"
    )
    parser.add_argument("--json", type=Path, help="write every field as JSON here")
    parser.add_argument("--png", type=Path, help="write the chart here")
    args = parser.parse_args(argv)
    try:
        doc = profile_pte(args.pte, args.inputs, args.iter, args.threads, args.etrecord,
                          args.etdump)  # fmt: skip
    except (OSError, RuntimeError, ValueError) as e:
        print(f"rustconv.profile: error: {e}", file=sys.stderr)
        return 1
    print(format_table(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    if args.png:
        chart(doc, args.png, args.pte.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
