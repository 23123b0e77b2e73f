"""The sweep: every model of sweep_models.py exported, lowered with
``[RustConvPartitioner(), XnnpackPartitioner()]``, run in
``executorch.runtime`` and in pte_runner and compared with eager (1e-4 times
each output's scale, zoo_harness's bar). One line per model, and a markdown
table at ``--out``.

    python tests/zoo/sweep.py [NAME ...] [--out PATH] [--work DIR] [--timeout S]

(``scripts/zoo_sweep.sh`` sets the environment.) Statuses:

* ``OK``;
* ``MISMATCH (ours|upstream)``: an output differs from eager; upstream's when
  XNNPACK alone differs too;
* ``LOWERING FAILS (ours|upstream)``: ``to_edge_transform_and_lower`` (or
  ``to_executorch``) raised; upstream's when it raises with XNNPACK alone too;
  ``explain()`` raising is ours;
* ``RUN FAILS (ours|upstream)``: a runtime raised, pte_runner exited non-zero,
  or the process died (a crash); upstream's when XNNPACK alone fails too;
* ``EXPORT FAILS (upstream)``: ``torch.export`` or ``to_edge`` failed with no
  partitioner at all;
* ``BUILD FAILS (catalogue)``: the builder or its eager call raised;
* ``TIMEOUT``: the model took longer than ``--timeout``.

Each model runs in a process of its own (forked), so a crash (a segfault
inside a runtime) is reported and the sweep goes on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


# One model, in its own process --------------------------------------------------------------


def _shorten(op: str) -> str:
    """``aten.mm.default`` -> ``mm``; reasons ("op: why") keep their why."""
    head, sep, why = op.partition(": ")
    parts = head.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        head = parts[1] if parts[2] == "default" else f"{parts[1]}.{parts[2]}"
    return head + sep + why


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"


def _run(lowered, work: Path) -> list[str]:
    """Mismatches (or a runtime's failure) of every call, in both runtimes."""
    from zoo_harness import run_in_pte_runner, run_in_runtime

    try:
        problems = run_in_runtime(lowered)
    except Exception as e:  # noqa: BLE001  (a runtime's failure is the result)
        problems = [f"executorch.runtime raised {_error(e)}"]
    return problems + run_in_pte_runner(lowered, work)


def xnnpack_alone(example, work: Path) -> str | None:
    """What goes wrong with XNNPACK alone: None when it lowers, runs and
    matches eager, else the first problem."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from zoo_harness import lower

    work.mkdir(parents=True, exist_ok=True)
    lowered = lower(example, work, partitioners=lambda: [XnnpackPartitioner()])
    if lowered.error is not None:
        return f"lowering: {_error(lowered.error)}"
    problems = _run(lowered, work)
    return problems[0] if problems else None


def check(name: str, work: Path, report) -> None:
    """Checks one model, calling ``report(**fields)`` as it learns them (the
    parent keeps the last report when this process dies)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge
    from rustconv import RustConvPartitioner
    from sweep_models import SWEEP
    from zoo_harness import lower
    from zoo_models import flatten

    torch.set_num_threads(2)
    start = time.monotonic()

    def done(status: str, detail: str = "", **fields) -> None:
        report(status=status, detail=detail, seconds=round(time.monotonic() - start, 1), **fields)

    report(stage="build")
    try:
        example = SWEEP[name].build()
        with torch.no_grad():
            flatten(example.module(*example.inputs))
    except Exception as e:  # noqa: BLE001
        return done("BUILD FAILS (catalogue)", _error(e))

    report(stage="lower")
    try:
        lowered = lower(
            example, work, partitioners=lambda: [RustConvPartitioner(), XnnpackPartitioner()]
        )
    except Exception as e:  # noqa: BLE001  (export, to_edge or explain() raised)
        report(stage="export")
        try:  # the same with no partitioner: upstream's if it fails there too
            to_edge(torch.export.export(example.module, example.inputs, strict=example.strict))
        except Exception as upstream:  # noqa: BLE001
            return done("EXPORT FAILS (upstream)", _error(upstream))
        return done("LOWERING FAILS (ours)", f"explain(): {_error(e)}")
    outside = {_shorten(op): len(nodes) for op, nodes in sorted(lowered.outside.items())}
    report(outside=outside)
    if lowered.error is not None:
        report(stage="lower with XNNPACK alone")
        alone = xnnpack_alone(example, work / "xnnpack")
        whose = "upstream" if alone is not None and alone.startswith("lowering") else "ours"
        return done(f"LOWERING FAILS ({whose})", _error(lowered.error))
    programs = lowered.programs
    report(
        rustconv=sum(p.rustconv_calls for p in programs),
        xnnpack=sum(p.xnnpack_calls for p in programs),
        stage="run",
    )
    problems = _run(lowered, work)
    if not problems:
        return done("OK")
    failed = any("raised" in p or "pte_runner failed" in p for p in problems)
    report(stage="run with XNNPACK alone")
    alone = xnnpack_alone(example, work / "xnnpack")
    whose = "upstream" if alone is not None else "ours"
    detail = "; ".join(problems)[:1500]
    if alone is not None:
        detail += f" | XNNPACK alone: {alone[:300]}"
    done(f"{'RUN FAILS' if failed else 'MISMATCH'} ({whose})", detail)


def child(name: str, work: Path, result: Path) -> None:
    fields: dict = {"name": name}

    def report(**kw) -> None:
        fields.update(kw)
        result.write_text(json.dumps(fields))

    try:
        check(name, work, report)
    except Exception as e:  # noqa: BLE001  (the sweep's own bug: said, not hidden)
        traceback.print_exc()
        report(status="SWEEP ERROR", detail=_error(e))


# The parent ------------------------------------------------------------------------------------


def _in_child(target, *args) -> None:
    """A forked child's body: its output to the model's log, then exit
    without running the parent's clean-up."""
    log = os.open(args[1] / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        target(*args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_one(name: str, work: Path, timeout: float, alone: bool = False) -> dict:
    """``check`` (or, with ``alone``, XNNPACK alone) in a forked child; a
    crash or a timeout is reported with the stage it happened in. The parent
    has imported torch, executorch and the models' packages (and run
    nothing), so a child starts in milliseconds."""
    work.mkdir(parents=True, exist_ok=True)
    result = work / ("alone.json" if alone else "result.json")
    result.unlink(missing_ok=True)
    start = time.monotonic()
    process = multiprocessing.get_context("fork").Process(
        target=_in_child, args=(child_alone if alone else child, name, work, result)
    )
    process.start()
    process.join(timeout)
    timed_out = process.is_alive()
    if timed_out:
        process.kill()
        process.join()
        how = f"timed out after {timeout:.0f} s"
    else:
        how = f"process died (exit {process.exitcode})"
    fields = json.loads(result.read_text()) if result.exists() else {"name": name}
    if "status" not in fields:
        fields["status"] = "TIMEOUT" if timed_out else "CRASH"
        fields["detail"] = f"{how} in stage {fields.get('stage', 'start')}"
    fields.setdefault("seconds", round(time.monotonic() - start, 1))
    return fields


def child_alone(name: str, work: Path, result: Path) -> None:
    """XNNPACK alone on one model: the classification of a crash."""
    from sweep_models import SWEEP

    problem = xnnpack_alone(SWEEP[name].build(), work / "xnnpack")
    result.write_text(
        json.dumps({"status": "OK" if problem is None else "FAILS", "detail": problem})
    )


def preload() -> None:
    """Imports what every child needs, once, before the first fork."""
    import executorch.runtime  # noqa: F401
    import torchaudio.models  # noqa: F401
    import transformers  # noqa: F401
    import zoo_harness  # noqa: F401


def sweep(
    names: list[str], work: Path, timeout: float, out: Path | None, earlier: list[dict]
) -> list[dict]:
    """Every model in turn; the table at ``out`` (with ``earlier`` results)
    rewritten after each, so an interrupted sweep keeps what it found."""
    results = []
    for name in names:
        fields = run_one(name, work / name, timeout)
        if fields["status"] == "CRASH":  # a timeout is said as it is, not classified
            alone = run_one(name, work / name, timeout, alone=True)
            whose = "ours" if alone["status"] == "OK" else "upstream"
            fields["status"] = f"RUN FAILS ({whose})"
            fields["detail"] += f" | XNNPACK alone: {alone['status']} {alone.get('detail') or ''}"
        (work / name / "result.json").write_text(json.dumps(fields))  # as classified
        results.append(fields)
        print(line(fields), flush=True)
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(table(earlier + results))
    return results


def _calls(fields: dict, key: str) -> str:
    return str(fields[key]) if key in fields else "-"


def _outside(fields: dict) -> str:
    return ", ".join(f"{op} x{n}" for op, n in fields.get("outside", {}).items())


def line(fields: dict) -> str:
    text = (
        f"{fields['name']}: {fields['status']} rustconv={_calls(fields, 'rustconv')} "
        f"xnnpack={_calls(fields, 'xnnpack')} ({fields['seconds']:.0f} s)"
    )
    if fields.get("outside"):
        text += f"\n    outside: {_outside(fields)}"
    if fields.get("detail"):
        text += f"\n    {fields['detail']}"
    return text


def versions() -> str:
    from importlib.metadata import version

    packages = ("torch", "executorch", "transformers", "torchaudio")
    return ", ".join(f"{p} {version(p)}" for p in packages)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                cpu = row.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def commit() -> str:
    run = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return run.stdout.strip() or "unknown"


def table(results: list[dict]) -> str:
    from sweep_models import SWEEP

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [
        "# Zoo sweep: upstream models with a 1-D convolution",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {commit()}; "
        f"{machine()}; {versions()}.",
        "",
        "`scripts/zoo_sweep.sh` (tests/zoo/sweep.py, catalogue tests/zoo/sweep_models.py): each "
        "model from a tiny random configuration, lowered with `[RustConvPartitioner(), "
        "XnnpackPartitioner()]`, run in executorch.runtime and pte_runner (2 threads), compared "
        "with eager at 1e-4 times each output's scale. A failure is upstream's when XNNPACK alone "
        "fails the same way. *Outside*: what `explain()` leaves to others (ops that are not "
        "RustConv ops, and reasons next to convs; zoo_harness.outside_summary), with node "
        "counts. Times include export, both lowerings and both runs on a shared 2-core machine.",
        "",
        "| model | source | status | RustConv calls | XNNPACK calls | outside RustConv | s |",
        "|---|---|---|---|---|---|---|",
    ]
    order = list(SWEEP)
    for r in sorted(results, key=lambda r: order.index(r["name"])):
        rows.append(
            f"| {r['name']} | {cell(SWEEP[r['name']].source)} | {r['status']} | "
            f"{_calls(r, 'rustconv')} | {_calls(r, 'xnnpack')} | {cell(_outside(r))} | "
            f"{r['seconds']:.0f} |"
        )
    details = sorted((r for r in results if r.get("detail")), key=lambda r: order.index(r["name"]))
    if details:
        rows += ["", "## Failures", ""]
        rows += [f"- **{r['name']}** ({r['status']}): {cell(r['detail'])}" for r in details]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="models to check (default: all)")
    parser.add_argument("--out", type=Path, help="markdown summary to write")
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "zoo-sweep")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="the table also lists the models of earlier runs in --work not run now",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per model")
    args = parser.parse_args(argv)
    from sweep_models import SWEEP

    unknown = [n for n in args.names if n not in SWEEP]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(SWEEP)}")
    preload()
    names = args.names or list(SWEEP)
    earlier = []
    if args.keep:
        for name in SWEEP:
            result = args.work / name / "result.json"
            if name not in names and result.exists():
                fields = json.loads(result.read_text())
                if "status" in fields:
                    earlier.append(fields)
    results = sweep(names, args.work, args.timeout, args.out, earlier)
    bad = [r for r in results if r["status"] != "OK"]
    print(f"{len(results)} models, {len(results) - len(bad)} OK, {len(bad)} not")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
