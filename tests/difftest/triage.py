"""From a failing program to a kept, shrunk reproducer.

For each distinct failure of a program (a signature per graph, or one for
the whole program):

1. the start: the graph alone if the failure names one and it still fails
   alone, else the whole program (shrinking then drops the other graphs);
2. the baseline: the same flow *without* RustConv (``to_edge`` alone, or
   XNNPACK alone); a failure that happens there too is not ours and is
   recorded as ``baseline`` (a generator or ExecuTorch limitation);
3. :func:`difftest.shrink.shrink` with the predicate "the same flow and
   runner still fail with the same signature (and, for an exception, the
   same kind of message)";
4. the shrunk program checked again through every flow and runner, and for
   the ``edge`` flow also through the blob reference interpreter
   (:mod:`rustconv.devtools.reference`), which says whether the blob is right (a
   runtime bug) or not (a lowering bug);
5. written as JSON (spec, failure, numbers) under ``<out>/failures``; a
   reproducer whose op shape was not seen before also goes to
   ``<out>/new_regressions``, ready to be copied to
   ``tests/difftest/regressions``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from difftest.check import Checker, Failure, Result, compare, output_dtype
from difftest.shrink import shrink, size
from difftest.spec import dump, single, subset

__all__ = ["triage", "fingerprint", "error_class"]


def _kind_class(failure: Failure) -> str:
    """A failure's kind and message class, whatever the flow and runner (a run
    error's message is the runner's own, so only its kind counts)."""
    if failure.kind in ("run_error", "crash", "timeout"):
        return failure.kind
    return error_class(failure).split(":", 1)[0] + "|" + error_class(failure).partition("|")[2]


def error_class(failure: Failure) -> str:
    """The part of a failure that must stay the same while shrinking."""
    if failure.kind in ("lower_error", "run_error"):
        text = failure.detail.split(":")[0] + ":" + ":".join(failure.detail.split(":")[1:2])
        text = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "#", text)
        return f"{failure.signature}|{text[:80]}"
    return failure.signature


def fingerprint(program: dict, signature: str) -> str:
    """Same op kinds in the same order and the same signature: the same finding."""
    parts = [signature, program["mode"]]
    for g in program["graphs"]:
        parts.append(g["dtype"])
        parts.extend(op["op"] + (f"/{op.get('fn')}" if "fn" in op else "") for op in g["ops"])
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def known_or_repaired(program: dict, predicate, flow: str) -> tuple[Any, dict]:
    """(the known bug that explains the failure, the program) or (None, the program
    with every known trigger repaired where the failure survives that)."""
    from difftest.known import applicable
    from difftest.shrink import is_valid

    bugs = {b.id: b for g in program["graphs"] for b in applicable(g, flow)}
    for bug in bugs.values():
        try:
            graphs = [bug.repair(g) if bug.applies(g) else g for g in program["graphs"]]
            repaired = {**program, "graphs": graphs}
        except Exception:  # noqa: BLE001  (a repair that does not apply here)
            continue
        if not is_valid(repaired):
            continue
        if not predicate(repaired):
            return bug, program
        program = repaired  # fails without the known trigger: a new finding
    return None, program


def _explained_by_baseline(
    failure: Failure, base: Result, wanted: str, mine: Result | None = None
) -> bool:
    """Whether the same flow without RustConv fails as badly: then the error
    is in what RustConv did not run (a portable kernel, XNNPACK) or in torch's
    export, not ours. A mismatch counts as explained only if the baseline's
    error is at least half of ours: both may be off for different reasons.
    ``mine``: the same program checked with RustConv, whose error is the one
    to compare: a shrunk program's can be far smaller than the original
    failure's, and then even an identical baseline failure looked too small
    (the likely cause of seed 900030's float16 cumsum being labelled ours);
    without it, ``failure``'s."""
    if failure.kind in ("lower_error", "run_error", "crash", "timeout"):
        # Messages differ with and without RustConv; the same kind of failure
        # of the same (shrunk) program is the same cause.
        return any(f.kind == failure.kind for f in base.failures)
    if not _matches(base, wanted):
        return False

    def worst(result: Result) -> float:
        return max(
            (
                f.numbers.get("max_err", float("inf"))
                for f in result.failures
                if error_class(f) == wanted
            ),
            default=0.0,
        )

    ours = worst(mine) if mine is not None and _matches(mine, wanted) else None
    if ours is None:
        ours = failure.numbers.get("max_err", float("inf"))
    return worst(base) >= 0.5 * ours


def _matches(result: Result, wanted: str) -> bool:
    return any(error_class(f) == wanted for f in result.failures)


def triage(
    checker: Checker,
    program: dict,
    result: Result,
    out: Path,
    budget_s: float = 600.0,
    seen: set[str] | None = None,
    log=print,
    shrink_baseline: bool = False,
) -> list[dict]:
    """Shrinks and records every distinct failure of ``result``; returns the records."""
    records = []
    # One triage per model and kind of failure: the same mismatch seen by both
    # runners and both flows is one finding (edge and executorch.runtime first);
    # the shrunk reproducer is checked through all of them at the end anyway.
    order = {"edge": 0, "xnn": 1, "runtime": 0, "pte_runner": 1, None: 2}
    groups: dict[tuple[int | None, str], Failure] = {}
    for f in sorted(result.failures, key=lambda f: (order[f.flow], order[f.runner])):
        groups.setdefault((f.graph, _kind_class(f)), f)
    done_graphs: set[tuple[int | None, str]] = set()
    for (graph, _), failure in groups.items():
        wanted = error_class(failure)
        if (graph, wanted) in done_graphs:
            continue
        t0 = time.monotonic()
        flows = (failure.flow,)
        runners = (failure.runner,) if failure.runner else ()

        def predicate(spec: dict, flows=flows, runners=runners, wanted=wanted) -> bool:
            try:
                return _matches(checker.check(spec, flows, runners), wanted)
            except Exception:  # noqa: BLE001  (a harness error is not the finding)
                return False

        start = None
        if graph is not None:
            alone = single(program, graph)
            bug, alone = known_or_repaired(alone, predicate, failure.flow)
            if bug is not None:
                log(f"triage: {wanted} graph {graph}: known bug {bug.id}")
                verdict = f"{'upstream' if bug.upstream else 'known'}:{bug.id}"
                records.append(_record(program, failure, wanted, verdict, None, None, out))
                done_graphs.add((graph, wanted))
                continue
            if predicate(alone):
                start = alone
        if start is None:
            start = subset(program, result.kept)
            if graph is None:
                bug, start = known_or_repaired(start, predicate, failure.flow)
                if bug is not None:
                    log(f"triage: {wanted} (program): known bug {bug.id}")
                    verdict = f"{'upstream' if bug.upstream else 'known'}:{bug.id}"
                    records.append(_record(program, failure, wanted, verdict, None, None, out))
                    done_graphs.add((graph, wanted))
                    continue
            if not predicate(start):
                log(f"triage: {wanted} (graph {graph}) did not reproduce; recorded as flaky")
                records.append(_record(program, failure, wanted, "flaky", None, None, out))
                continue
        # A model's mismatch is checked without RustConv at once; a failure of a
        # whole program only once shrinking has isolated it (another model of
        # the program may fail without RustConv for a reason of its own).
        base = checker.check(start, flows, runners, baseline=True) if graph is not None else None
        if base is not None and _explained_by_baseline(failure, base, wanted):
            # Not ours; shrunk briefly all the same, to show what the generator
            # should stop writing (or what to report upstream).
            def base_predicate(spec: dict, flows=flows, runners=runners) -> bool:
                try:
                    return bool(checker.check(spec, flows, runners, baseline=True).failures)
                except Exception:  # noqa: BLE001
                    return False

            small = start
            if shrink_baseline:
                small = shrink(start, base_predicate, budget_s=min(180.0, budget_s))
            log(f"triage: {wanted} also fails without RustConv: not ours ({size(small)})")
            records.append(_record(program, failure, wanted, "baseline", small, None, out))
            done_graphs.add((graph, wanted))
            continue
        budget = max(30.0, budget_s - (time.monotonic() - t0))
        shrunk = shrink(start, predicate, budget_s=budget)
        base = checker.check(shrunk, flows, runners, baseline=True)
        final = checker.check(shrunk)
        explained = _explained_by_baseline(failure, base, wanted, mine=final)
        verdict = "baseline" if explained else "ours"
        diagnosis = _diagnose(shrunk) if failure.flow == "edge" else None
        record = _record(program, failure, wanted, verdict, shrunk, final, out, diagnosis)
        record["shrink_seconds"] = round(time.monotonic() - t0, 1)
        fp = fingerprint(shrunk, failure.signature)
        record["fingerprint"] = fp
        if verdict == "ours" and seen is not None and fp not in seen:
            seen.add(fp)
            new = out / "new_regressions"
            new.mkdir(parents=True, exist_ok=True)
            _write_regression(new / f"{failure.kind}_{fp}.json", shrunk, record)
        records.append(record)
        log(
            f"triage: {wanted} graph {graph} -> {verdict}, size {size(shrunk)} "
            f"in {record['shrink_seconds']} s ({fp})"
        )
        done_graphs.add((graph, wanted))
    return records


def _record(program, failure, wanted, verdict, shrunk, final, out: Path, diagnosis=None) -> dict:
    record: dict[str, Any] = {
        "seed": program.get("seed"),
        "verdict": verdict,
        "signature": wanted,
        "failure": asdict(failure),
        "shrunk": shrunk,
        "shrunk_failures": [asdict(f) for f in final.failures] if final else None,
        "refused": dict(final.refused) if final else None,
        "diagnosis": diagnosis,
    }
    folder = out / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{program.get('seed')}_{failure.graph}_{failure.kind}_{failure.flow}_{failure.runner}"
    (folder / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    if shrunk is None:
        (folder / f"{name}.program.json").write_text(dump(program) + "\n")
    return record


def _write_regression(path: Path, program: dict, record: dict) -> None:
    failure = record["failure"]
    entry = {
        "found": f"seed {record['seed']}: {failure['kind']} in {failure['flow']}"
        f"/{failure['runner']}: {failure['detail'][:300]}",
        "diagnosis": record.get("diagnosis"),
        "xfail": None,
        "program": program,
    }
    path.write_text(format_regression(entry))


def format_regression(entry: dict) -> str:
    """JSON with one op per line, so reproducers read (and diff) well."""
    program = copy.deepcopy(entry["program"])
    graphs = program.pop("graphs")
    lines = ["{"]
    for key in ("found", "diagnosis", "xfail"):
        lines.append(f" {json.dumps(key)}: {json.dumps(entry.get(key))},")
    head = json.dumps(program)[1:-1]
    lines.append(f' "program": {{{head}, "graphs": [')
    for gi, g in enumerate(graphs):
        ops = g.pop("ops")
        outputs = g.pop("outputs")
        lines.append("  {" + json.dumps(g)[1:-1] + ', "ops": [')
        for oi, op in enumerate(ops):
            lines.append("   " + json.dumps(op) + ("," if oi + 1 < len(ops) else ""))
        tail = "  ]" + f', "outputs": {json.dumps(outputs)}}}'
        lines.append(tail + ("," if gi + 1 < len(graphs) else ""))
    lines.append(" ]}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _diagnose(program: dict) -> str | None:
    """Whether the blob is right: the lowered program run with RustConv's delegates
    interpreted by ``rustconv.devtools.reference`` (stateless programs only)."""
    if program["mode"] == "stateful":
        return None
    try:
        import warnings

        import torch
        from executorch.exir import to_edge
        from rustconv import RustConvPartitioner

        from difftest.spec import DiffModel, call_inputs, dynamic_shapes, example_inputs

        ep = torch.export.export(
            DiffModel(program).eval(),
            example_inputs(program),
            dynamic_shapes=dynamic_shapes(program),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            edge = to_edge(ep).to_backend(RustConvPartitioner())
        import sys

        helpers = Path(__file__).resolve().parents[1]  # tests/: rustconv_test_helpers
        if str(helpers) not in sys.path:
            sys.path.insert(0, str(helpers))
        from rustconv_test_helpers import run_lowered

        inputs = call_inputs(program, 0)
        got, _ = run_lowered(edge, inputs)
        eager = DiffModel(program).eval()(*inputs)
        ref = DiffModel(program, reference=True)(*call_inputs(program, 0, reference=True))
        graph = program["graphs"][0]
        wrong = [
            i
            for i, (g, e, r, name) in enumerate(zip(got, eager, ref, graph["outputs"], strict=True))
            if compare(g.detach().double().numpy(), e, r, output_dtype(graph, name))
        ]
        if wrong:
            return f"the blob is wrong too (reference interpreter, outputs {wrong}): lowering"
        return "the blob is right (reference interpreter matches eager): runtime"
    except Exception as e:  # noqa: BLE001
        return f"reference interpreter could not run: {type(e).__name__}: {str(e)[:200]}"
