"""``interference``: whether our calls slow down the other delegates' calls
(issue 16, rule two), read from the profile as a user would.

One zoo entry (default: ExecuTorch's LFM2 recipes) is lowered as shipped
(the ``xnnpack`` alternative) and with RustConv first (``ours``). Each
variant runs in pte_runner with an ETDump (``-etdump_path``) over a prefill
and ``decode`` one-token steps, state carried (``-steps_npz_paths``); from the
trace, per ``Method::execute``, come the step's time, the sum of XNNPACK's
``DELEGATE_CALL`` events, RustConv's, and everything else (the portable and
custom ops between them). Variants:

* ``shipped``: the recipe as shipped, ``-num_threads T``;
* ``rustconv``: with RustConv, ``-num_threads T`` (RustConv has T too);
* ``rustconv@k``: the same program, ``-rustconv_threads k`` (XNNPACK keeps T):
  with k = 1 RustConv has no worker thread at all, the control for "our
  workers compete with XNNPACK's";
* ``rustconv-own``: the same program with ``RUSTCONV_THREADPOOL=own``: our
  kernels on a pool of our own instead of ExecuTorch's threadpool, which
  they share with XNNPACK by default (delegate/src/threads.rs).

The machine may be busy, so variants are interleaved: each round runs every
variant once, in an order reversed every other round (A B C, C B A, ...) so
a drift in load falls on all alike; a variant's figure is the median over
rounds of its per-run medians, with the spread (min and max of those per-run
medians). XNNPACK's slowdown is computed per round against that round's
``shipped`` run, then the median and spread over rounds are given. ETDump's
own cost is in every variant alike (a few percent).

    bench/run.py interference --threads 2 --rounds 7        # fp32 and q8da4w, full size
    bench/run.py interference model=et_lfm2_fp32 size=small --rounds 3 --repeats 3

Writes ``interference.json`` and ``interference.md`` to the output folder.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import lowering, measure, workload

#: Zoo entries measured when none is named: the LFM2 recipes.
DEFAULT_MODELS = ("et_lfm2_fp32", "et_lfm2_q8da4w")
XNNPACK = "XnnpackBackend"
RUSTCONV = "RustConvBackend"
#: A step's parts: XNNPACK's calls common to both programs (same delegate
#: data, same order), the XNNPACK calls that differ (around the subgraphs
#: RustConv takes), RustConv's calls, everything else.
PARTS = ("step", "xnnpack", "replaced", "rustconv", "other")


@dataclass(frozen=True)
class Variant:
    name: str
    alt: str  # the bench alternative whose program runs: xnnpack (as shipped) or ours
    rustconv_threads: int | None = None  # pte_runner -rustconv_threads
    env: tuple[tuple[str, str], ...] = ()  # environment of the run


def variants(threads: int, rustconv_threads: list[int]) -> list[Variant]:
    out = [Variant("shipped", "xnnpack"), Variant("rustconv", "ours")]
    if threads > 1:
        out.append(Variant("rustconv-own", "ours", env=(("RUSTCONV_THREADPOOL", "own"),)))
    out += [Variant(f"rustconv@{k}", "ours", k) for k in rustconv_threads if k != threads]
    return out


@dataclass
class StepTimes:
    """Per ``Method::execute`` (warm-ups dropped): ms of the whole step and
    of its parts."""

    step: list[float]
    xnnpack: list[float]
    replaced: list[float]
    rustconv: list[float]
    other: list[float]


def delegate_calls(pte: Path) -> list[tuple[str, str]]:
    """(backend, digest of its delegate data) of each DelegateCall
    instruction of the program's first method, in instruction order
    (without an ETRecord the Inspector names no backend but RustConv's)."""
    import hashlib

    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes()).program
    plan = program.execution_plan[0]
    out = []
    for chain in plan.chains:
        for instruction in chain.instructions:
            if type(instruction.instr_args).__name__ != "DelegateCall":
                continue
            delegate = plan.delegates[instruction.instr_args.delegate_index]
            data = program.backend_delegate_data[delegate.processed.index].data
            out.append((delegate.id, hashlib.sha256(bytes(data)).hexdigest()))
    return out


def common_calls(
    shipped: list[tuple[str, str]], ours: list[tuple[str, str]]
) -> tuple[list[bool], list[bool]]:
    """Which calls of each program are common to both: the longest matching
    subsequence of (backend, delegate data), the calls rule one leaves
    alone. The others are around RustConv's subgraphs: XNNPACK's parts of a
    short conv in the shipped program, XNNPACK's calls regrouped around
    ours in the other."""
    import difflib

    matcher = difflib.SequenceMatcher(a=shipped, b=ours, autojunk=False)
    in_a, in_b = [False] * len(shipped), [False] * len(ours)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            in_a[block.a + k] = in_b[block.b + k] = True
    return in_a, in_b


def step_times(etdump: Path, drop: int, parts_of_calls: list[str]) -> StepTimes:
    """Sums each execute's events into its parts, ``parts_of_calls`` naming
    the part of each delegate call (the n-th DELEGATE_CALL of the trace is
    the program's n-th delegate call); the ops between them are ``other``."""
    from rustconv.devtools.trace import read_profile

    profile = read_profile(etdump)
    profile.drop_first(drop)
    if len(profile.calls) != len(parts_of_calls):
        raise RuntimeError(
            f"{len(profile.calls)} delegate calls traced, {len(parts_of_calls)} in the program"
        )
    n = len(profile.method_ms)
    parts = {p: [0.0] * n for p in PARTS[1:]}
    for call, part in zip(profile.calls, parts_of_calls, strict=True):
        if bool(call.kernels) != (part == "rustconv"):
            raise RuntimeError(f"delegate call {call.index}: RustConv's kernels in {part}")
        _add(parts[part], call.times_ms, n, f"{part} call {call.index}")
    for op in profile.ops:
        _add(parts["other"], op.times_ms, n, op.name)
    return StepTimes(list(profile.method_ms), **parts)


def _add(acc: list[float], times: list[float], n: int, what: str) -> None:
    if len(times) != n:
        raise RuntimeError(f"{what}: {len(times)} events for {n} executes")
    for i, t in enumerate(times):
        acc[i] += t


def phase_medians(times: StepTimes, calls_per_iter: int) -> dict[str, dict[str, float]]:
    """{"prefill": {part: median ms}, "decode": {...}}: call position 0 of
    each iteration is the prefill, the others decode steps."""
    out = {}
    for phase, pick in (("prefill", lambda i: i == 0), ("decode", lambda i: i > 0)):
        idx = [i for i in range(len(times.step)) if pick(i % calls_per_iter)]
        if idx:
            out[phase] = {p: statistics.median(getattr(times, p)[i] for i in idx) for p in PARTS}
    return out


def run_variant(
    args, v: Variant, pte: Path, parts: list[str], steps: list[Path], work: Path
) -> StepTimes:
    etdump = work / f"interference-{v.name.replace('@', '-')}.etdump"
    extra = ["-rustconv_threads", str(v.rustconv_threads)] if v.rustconv_threads else []
    threads = args.threads[0]
    measure.run_pte(
        args.runner_path, pte, steps[0], work / "interference-out.npz", args.warmup,
        args.repeats, threads, timeout_s=args.time_limit * len(steps) * (args.warmup +
        args.repeats) + 120, etdump=etdump, steps=steps, extra=extra, keep_etdump=True,
        env=dict(v.env),
    )  # fmt: skip
    try:
        return step_times(etdump, args.warmup * len(steps), parts)
    finally:
        etdump.unlink(missing_ok=True)


def summarize(rounds: list[dict[str, dict]], names: list[str]) -> dict:
    """Per phase and variant: each part's median over rounds and its spread;
    XNNPACK's and the step's change against the same round's ``shipped``."""
    out: dict = {}
    for phase in ("prefill", "decode"):
        per = {}
        for name in names:
            runs = [r[name][phase] for r in rounds if phase in r.get(name, {})]
            if not runs:
                continue
            entry = {}
            for part in PARTS:
                xs = [run[part] for run in runs]
                entry[part] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
            if name != "shipped":
                for part in ("xnnpack", "step"):
                    ratios = [
                        r[name][phase][part] / r["shipped"][phase][part] - 1
                        for r in rounds
                        if r.get("shipped", {}).get(phase, {}).get(part)
                    ]
                    if ratios:
                        entry[f"{part}_change"] = {
                            "median": statistics.median(ratios),
                            "min": min(ratios),
                            "max": max(ratios),
                        }
            entry["rustconv_share"] = entry["rustconv"]["median"] / entry["step"]["median"]
            per[name] = entry
        if per:
            out[phase] = per
    return out


def markdown(meta: dict, results: dict) -> str:
    lines = [
        "# Interference: XNNPACK's own time with and without RustConv (rule two)",
        "",
        f"{meta['date']}, {meta['machine']['cpu_model']}, {meta['threads']} threads, "
        f"{meta['rounds']} rounds x {meta['repeats']} iterations (each a prefill and its "
        "decode steps), others' CPU busy "
        f"{_pct(meta.get('others_busy_start'))} at start, {_pct(meta.get('others_busy_end'))} "
        "at end. Medians over rounds of per-run medians, [min, max] over rounds; changes are "
        "against the same round's `shipped` run.",
        "",
    ]
    for model, res in results.items():
        lines += [
            f"## {model}",
            "",
            f"A prefill of {res['prompt']} tokens, then {res['decode_steps']} decode steps. "
            f"Delegate calls per step: {res['calls']}. XNNPACK: its calls common to both "
            "programs (the same delegate data, in the same order); replaced: XNNPACK's calls "
            "that differ, around the subgraphs RustConv takes.",
            "",
        ]
        for phase, per in res["summary"].items():
            lines += [
                f"### {phase}",
                "",
                "| variant | step ms | tokens/s | XNNPACK ms | XNNPACK change | replaced ms "
                "| RustConv ms | RustConv share | other ms | step change |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            tokens = res["prompt"] if phase == "prefill" else 1
            for name, e in per.items():
                lines.append(
                    f"| {name} | {_ms(e['step'])} | {tokens / e['step']['median'] * 1e3:.1f} "
                    f"| {_ms(e['xnnpack'])} | {_chg(e.get('xnnpack_change'))} "
                    f"| {_ms(e['replaced'])} "
                    f"| {_ms(e['rustconv'])} | {e['rustconv_share']:.2%} | {_ms(e['other'])} "
                    f"| {_chg(e.get('step_change'))} |"
                )
            lines.append("")
    return "\n".join(lines) + "\n"


def _ms(d: dict) -> str:
    return f"{d['median']:.3f} [{d['min']:.3f}, {d['max']:.3f}]"


def _chg(d: dict | None) -> str:
    if d is None:
        return ""
    return f"{d['median']:+.1%} [{d['min']:+.1%}, {d['max']:+.1%}]"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def parse(filters: list[str]) -> tuple[tuple[str, ...], str]:
    models, size = DEFAULT_MODELS, "full"
    for token in filters:
        if token == "interference":
            continue
        key, _, value = token.partition("=")
        if key == "model":
            models = tuple(v for v in value.split(",") if v)
        elif key == "size" and value in ("full", "small"):
            size = value
        else:
            raise SystemExit(f"interference takes model=.. and size=full|small, not {token!r}")
    from bench import zoo

    unknown = [m for m in models if not zoo.is_recipe(m) or zoo.DECODE in m]
    if unknown:
        raise SystemExit(
            f"interference runs ExecuTorch's recipes (their XNNPACK calls are the same with and "
            f"without RustConv): {sorted(zoo.RECIPES)}, not {unknown}"
        )
    return models, size


def main(args, meta: dict, out: Path, work: Path) -> int:
    from tqdm import tqdm

    models, size = parse(args.filters)
    threads = args.threads[0]
    if len(args.threads) > 1:
        raise SystemExit("interference runs at one --threads count")
    rc_threads = args.rustconv_threads or ([1] if threads > 1 else [])
    names = [v.name for v in variants(threads, rc_threads)]
    results = {}
    meta.update(rounds=args.rounds, rustconv_threads=rc_threads, kind="interference")
    for model in models:
        (setting,) = workload.make_settings(("zoo",), (), (), (), zoo=(model + ":decode",),
                                            zoo_size=size)  # fmt: skip
        data = workload.make_data(setting, args.seed)
        print(f"{model}: exporting (cached in {args.cache_dir})", file=sys.stderr)
        ptes = {alt: lowering.lowered_pte(alt, data, args.seed, args.cache_dir)
                for alt in ("xnnpack", "ours")}  # fmt: skip
        steps = lowering.steps_npz(data, args.seed, args.cache_dir)
        calls = {alt: delegate_calls(lowered.pte) for alt, lowered in ptes.items()}
        common, common_ours = common_calls(calls["xnnpack"], calls["ours"])
        if any(b != XNNPACK for b, _ in calls["xnnpack"]) or RUSTCONV not in dict(calls["ours"]):
            raise SystemExit(f"{model}: not XNNPACK's calls as shipped, or no RustConv call")
        parts = {
            "xnnpack": ["xnnpack" if c else "replaced" for c in common],
            "ours": [
                "rustconv" if b == RUSTCONV else "xnnpack" if c else "replaced"
                for (b, _), c in zip(calls["ours"], common_ours, strict=True)
            ],
        }
        rounds: list[dict] = []
        vs = variants(threads, rc_threads)
        bar = tqdm(total=args.rounds * len(vs), desc=model, file=sys.stderr)
        for r in range(args.rounds):
            this = {}
            for v in vs if r % 2 == 0 else vs[::-1]:
                times = run_variant(args, v, ptes[v.alt].pte, parts[v.alt], steps, work)
                this[v.name] = phase_medians(times, len(steps))
                bar.update()
            rounds.append(this)
        bar.close()
        results[model] = {
            "prompt": int(data.zoo.calls[0][0].shape[-1]),
            "decode_steps": len(steps) - 1,
            "calls": {
                "shipped": {p: parts["xnnpack"].count(p) for p in ("xnnpack", "replaced")},
                "rustconv": {p: parts["ours"].count(p) for p in PARTS[1:4]},
            },
            "rounds": rounds,
            "summary": summarize(rounds, names),
        }
    meta["others_busy_end"] = measure.others_cpu_busy()
    (out / "interference.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1) + "\n"
    )
    (out / "interference.md").write_text(markdown(meta, results))
    print((out / "interference.md").read_text())
    return 0
