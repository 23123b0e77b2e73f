"""The long run: ``python -m difftest.fuzz --minutes M --jobs J --seed S --out DIR``.

``J`` worker processes (``--worker``) each check programs of seeds
``S + j, S + j + J, S + j + 2J, ...`` until the time is up, shrink every
failure (:mod:`difftest.triage`) and append one JSON line per program to
``DIR/job<j>.jsonl``. The parent then sums them into ``DIR/summary.json``
and prints one summary line::

    fuzz: 5120 models (640 programs) in 60.0 min, 1.42 models/s with 2 jobs; 0 failing models; ...

A model is one graph of a program (each with its own inputs and outputs,
checked on its own); ``scripts/fuzz_models.sh`` wraps this.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

__all__ = ["main"]


def _worker(args: argparse.Namespace) -> None:
    import warnings

    warnings.simplefilter("ignore")
    from difftest import speed
    from difftest.check import Checker
    from difftest.generate import generate_program
    from difftest.triage import triage

    speed.install()
    out = Path(args.out)
    deadline = args.deadline
    log_path = out / f"job{args.worker}.jsonl"
    seen_path = out / "fingerprints.txt"
    checker = Checker(out / f"work{args.worker}")

    def log(text: str) -> None:
        print(f"[job {args.worker}] {text}", flush=True)

    k = 0
    with log_path.open("a") as log_file:
        while time.time() < deadline:
            seed = args.seed + args.worker + k * args.jobs
            k += 1
            t0 = time.perf_counter()
            program = generate_program(seed, graphs=args.graphs)
            t_gen = time.perf_counter() - t0
            result = checker.check(program)
            line = {
                "seed": seed,
                "mode": program["mode"],
                "models": result.models,
                "invalid": len(result.invalid),
                "invalid_why": sorted({w.split(":")[0] for w in result.invalid.values()}),
                "failed_graphs": sorted({f.graph for f in result.failures if f.graph is not None}),
                "program_failures": sum(1 for f in result.failures if f.graph is None),
                "signatures": sorted({f.signature for f in result.failures}),
                "seconds": round(time.perf_counter() - t0, 2),
                "generate_seconds": round(t_gen, 2),
                "times": {k: round(v, 2) for k, v in result.times.items()},
                "proposed": result.proposed,
                "delegates": result.delegates,
                "refused": dict(result.refused),
                "anchors": dict(result.anchors),
            }
            if result.failures:
                log(f"seed {seed}: {len(result.failures)} failures: {line['signatures']}")
                for f in result.failures[:4]:
                    log("  " + f.describe()[:300])
                if not args.no_shrink:
                    seen = set(seen_path.read_text().split()) if seen_path.exists() else set()
                    before = set(seen)
                    budget = min(args.shrink_budget, max(60.0, deadline - time.time()))
                    records = triage(
                        checker, program, result, out, budget, seen, log=log,
                        shrink_baseline=args.shrink_baseline,
                    )  # fmt: skip
                    with seen_path.open("a") as f:
                        f.writelines(fp + "\n" for fp in seen - before)
                    line["triage"] = [
                        {
                            "graph": r["failure"]["graph"],
                            "signature": r["signature"],
                            "verdict": r["verdict"],
                            "fingerprint": r.get("fingerprint"),
                        }
                        for r in records
                    ]
            log_file.write(json.dumps(line) + "\n")
            log_file.flush()
    checker.close()


def _rank(verdict: str) -> int:
    """Ours first, then flaky, known bugs, and last what fails without RustConv."""
    if verdict.startswith(("baseline", "upstream")):
        return 3
    return {"ours": 0, "flaky": 1}.get(verdict, 2)


def summarize(out: Path | list[Path], elapsed: float, jobs: int) -> dict:
    """Totals of one run's folder (or of several runs' folders)."""
    folders = out if isinstance(out, list) else [out]
    lines = []
    for folder in folders:
        for path in sorted(folder.glob("job*.jsonl")):
            lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    models = sum(line["models"] for line in lines)
    failing = sum(len(line["failed_graphs"]) for line in lines)
    program_failures = sum(1 for line in lines if line["program_failures"])
    signatures: Counter = Counter()
    verdicts: Counter = Counter()
    fingerprints = set()
    by_model: Counter = Counter()  # failing models by what triage made of them
    for line in lines:
        signatures.update(line["signatures"])
        verdict_of: dict = {}
        for t in line.get("triage", []):
            verdicts[t["verdict"]] += 1
            if t["verdict"] == "ours" and t.get("fingerprint"):
                fingerprints.add(t["fingerprint"])
            # A model counts once, under its most serious verdict.
            old = verdict_of.get(t.get("graph"))
            if old is None or _rank(t["verdict"]) < _rank(old):
                verdict_of[t.get("graph")] = t["verdict"]
        for graph in line["failed_graphs"]:
            by_model[verdict_of.get(graph, "untriaged")] += 1
    refused: Counter = Counter()
    anchors: Counter = Counter()
    invalid_why: Counter = Counter()
    for line in lines:
        refused.update(line["refused"])
        anchors.update(line["anchors"])
        invalid_why.update(line.get("invalid_why", []))
    summary = {
        "programs": len(lines),
        "models": models,
        "invalid_graphs": sum(line["invalid"] for line in lines),
        "invalid_why": dict(invalid_why),
        "failing_models": failing,
        "failing_programs_unattributed": program_failures,
        "signatures": dict(signatures),
        "triage_verdicts": dict(verdicts),
        "failing_models_by_verdict": dict(by_model),
        "distinct_findings": sorted(fingerprints),
        "elapsed_s": round(elapsed, 1),
        "jobs": jobs,
        "models_per_s": round(models / elapsed, 3) if elapsed else 0.0,
        "modes": dict(Counter(line["mode"] for line in lines)),
        "anchors": dict(anchors),
        "refused": dict(refused.most_common(40)),
    }
    if not isinstance(out, list):
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def summary_line(s: dict) -> str:
    return (
        f"fuzz: {s['models']} models ({s['programs']} programs) in {s['elapsed_s'] / 60:.1f} min, "
        f"{s['models_per_s']:.2f} models/s with {s['jobs']} jobs; "
        f"{s['failing_models']} failing models {s['failing_models_by_verdict'] or ''}, "
        f"{s['failing_programs_unattributed']} failing "
        f"programs not attributed to one model, {len(s['distinct_findings'])} distinct findings "
        f"after shrinking; {s['invalid_graphs']} invalid graphs dropped"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="fuzz-out")
    parser.add_argument("--graphs", type=int, default=8, help="random models per program")
    parser.add_argument("--shrink-budget", type=float, default=900.0, help="seconds per failure")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument(
        "--shrink-baseline",
        action="store_true",
        help="also shrink failures that happen without RustConv (not ours)",
    )
    parser.add_argument(
        "--summarize",
        nargs="+",
        metavar="DIR",
        help="print the totals of earlier runs' folders (the time is their checking time)",
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.summarize:
        folders = [Path(d) for d in args.summarize]
        seconds = sum(
            json.loads(line)["seconds"]
            for d in folders
            for p in d.glob("job*.jsonl")
            for line in p.read_text().splitlines()
            if line.strip()
        )
        summary = summarize(folders, seconds, 1)
        print(summary_line(summary))
        print(json.dumps({k: summary[k] for k in ("signatures", "triage_verdicts", "modes")}))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.worker is not None:
        _worker(args)
        return 0
    start = time.time()
    deadline = start + args.minutes * 60
    here = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(here.parent / "partitioner_py"), env.get("PYTHONPATH", "")]
    )
    procs = []
    for j in range(args.jobs):
        cmd = [
            sys.executable, "-m", "difftest.fuzz", "--worker", str(j), "--jobs", str(args.jobs),
            "--seed", str(args.seed), "--out", str(out), "--graphs", str(args.graphs),
            "--shrink-budget", str(args.shrink_budget), "--deadline", str(deadline),
        ] + (["--no-shrink"] if args.no_shrink else []) + (
            ["--shrink-baseline"] if args.shrink_baseline else [])  # fmt: skip
        log = (out / f"job{j}.log").open("a")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    summary = summarize(out, time.time() - start, args.jobs)
    print(summary_line(summary))
    if any(codes):
        print(f"fuzz: worker exit codes {codes} (see {out}/job*.log)")
        return 2
    return 1 if summary["failing_models"] or summary["failing_programs_unattributed"] else 0


if __name__ == "__main__":
    sys.exit(main())
