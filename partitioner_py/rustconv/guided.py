"""Profile-guided partitioning: delegate a candidate only where it is faster.

Every group of ops :mod:`rustconv.export.partition_proposal` proposes (one delegate
call each, in execution order) is a *candidate*. Whether it should run in
RustConv or be left to the rest of the pipeline (the partitioners after ours,
e.g. XNNPACK, else ExecuTorch's CPU kernels) is decided from measurements
taken where the program will run, by timing whole programs, so every cost
of crossing between delegates is in the numbers:

* ``T_all``: every candidate delegated; its ETDump gives each candidate's own
  delegate call time, ``rustconv_ms[i]``;
* ``T_-i``: every candidate but ``i``; ``rest_ms[i] = rustconv_ms[i] + T_-i -
  T_all`` is what the same ops cost left to the rest, the change in crossings
  included;
* ``T_-i,-(i+1)`` for neighbouring candidates: the interaction of leaving
  both out (e.g. XNNPACK taking both in one call), ``rest_rest_ms[i] =
  T_-i,-(i+1) - T_-i - T_-(i+1) + T_all``.

Each time is the fastest of the timed iterations: these are differences of
whole-program times, and interference from other work only ever adds time.
The variants run in interleaved rounds (every variant once per round, see
:data:`ROUNDS`), so a slow stretch of the target (a background task, a
phone throttling as it warms up) slows every variant instead of the ones
that happened to run then.

The choice is the cheapest sequence over the chain of candidates by dynamic
programming, each step costing its time under its choice plus the
transition from the previous choice (``rest_rest_ms`` between two candidates
both left out, zero otherwise). The decision and the measurements are
printed, saved (``decision_path``) and can be given back as a profile file
(``GuidedPartitioner(profile="decision.json")``).

On the target: :func:`export_variants` writes the variants, their manifest
and a script that runs them in ``pte_runner`` there; the directory, with the
ETDumps the script leaves, is the profile
(``GuidedPartitioner(profile=<dir>)``), so measurements taken on the phone
decide the export on the workstation. ``profile="measure"`` runs the same
loop on this machine.

:class:`GuidedPartitioner` is :class:`rustconv.RustConvPartitioner` with this
choice on top: it overrides which candidates are taken, nothing else.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from rustconv.backend_id import BACKEND_ID
from rustconv.devtools.pte_runner import WARMUP, run_pte, runner_args
from rustconv.devtools.trace import read_profile
from rustconv.export.partition_proposal import candidate_keys
from rustconv.export.partitioner import RustConvPartitioner

__all__ = [
    "Decision",
    "GuidedPartitioner",
    "candidate_keys",
    "decide",
    "decide_from_variants",
    "export_variants",
    "load_profile",
    "lower_guided",
    "measure",
    "run_variants",
]

DELEGATE, REST = "rustconv", "rest"


@dataclass
class Decision:
    """What was measured (or read) and what was chosen, per candidate."""

    keys: list[str]
    rustconv_ms: list[float]
    rest_ms: list[float]
    rest_rest_ms: list[float]
    choice: list[str]
    measurements: dict[str, Any]

    def delegated(self) -> set[str]:
        return {k for k, c in zip(self.keys, self.choice, strict=True) if c == DELEGATE}

    def to_json(self) -> dict[str, Any]:
        return {
            "candidates": [
                {"index": i, "nodes": k.split(","), "rustconv_ms": r, "rest_ms": x, "choice": c}
                for i, (k, r, x, c) in enumerate(
                    zip(self.keys, self.rustconv_ms, self.rest_ms, self.choice, strict=True)
                )
            ],
            "transitions": [
                {"between": [i, i + 1], "rest_rest_ms": e} for i, e in enumerate(self.rest_rest_ms)
            ],
            "measurements": self.measurements,
        }

    def format(self) -> str:
        lines = ["RustConv profile-guided partitioning:"]
        for i, (k, r, x, c) in enumerate(
            zip(self.keys, self.rustconv_ms, self.rest_ms, self.choice, strict=True)
        ):
            ops = k if len(k) <= 70 else k[:67] + "..."
            where = "RustConv" if c == DELEGATE else "the rest"
            lines.append(
                f"  candidate {i}: RustConv {r:.3f} ms, left to the rest {x:.3f} ms -> {where}"
                f"  [{ops}]"
            )
        for i, e in enumerate(self.rest_rest_ms):
            if e:
                lines.append(f"  candidates {i} and {i + 1} both left out: {e:+.3f} ms")
        return "\n".join(lines)


def decide(
    keys: list[str],
    rustconv_ms: list[float],
    rest_ms: list[float],
    rest_rest_ms: list[float] | None = None,
    measurements: dict[str, Any] | None = None,
) -> Decision:
    """The cheapest choice per candidate, by dynamic programming over the chain."""
    n = len(keys)
    rest_rest_ms = list(rest_rest_ms or [0.0] * max(n - 1, 0))
    step = [{DELEGATE: rustconv_ms[i], REST: rest_ms[i]} for i in range(n)]

    def transition(i: int, previous: str, current: str) -> float:
        return rest_rest_ms[i - 1] if previous == current == REST else 0.0

    best: list[dict[str, tuple[float, str | None]]] = []
    for i in range(n):
        row = {}
        for current in (DELEGATE, REST):
            if i == 0:
                row[current] = (step[0][current], None)
                continue
            row[current] = min(
                (
                    best[i - 1][previous][0] + transition(i, previous, current) + step[i][current],
                    previous,
                )
                for previous in (DELEGATE, REST)
            )
        best.append(row)
    choice: list[str] = []
    if n:
        # Ties go to RustConv (the measured cost is the same; fewer crossings).
        current = min((DELEGATE, REST), key=lambda s: (best[-1][s][0], s != DELEGATE))
        for i in range(n - 1, -1, -1):
            choice.append(current)
            current = best[i][current][1] or DELEGATE
        choice.reverse()
    return Decision(
        keys, list(rustconv_ms), list(rest_ms), rest_rest_ms, choice, measurements or {}
    )


def from_profile(doc: dict[str, Any], keys: list[str]) -> Decision:
    """A decision for ``keys`` from a profile file (a saved decision)."""
    by_key = {",".join(c["nodes"]): c for c in doc["candidates"]}
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise ValueError(
            f"the profile has no measurement for candidate(s) {missing}; it was made for "
            "another program (re-measure with profile='measure')"
        )
    index = {k: by_key[k]["index"] for k in keys}
    pairs = {tuple(t["between"]): t["rest_rest_ms"] for t in doc.get("transitions", [])}
    rest_rest = [pairs.get((index[a], index[b]), 0.0) for a, b in zip(keys, keys[1:], strict=False)]
    return decide(
        keys,
        [by_key[k]["rustconv_ms"] for k in keys],
        [by_key[k]["rest_ms"] for k in keys],
        rest_rest,
        doc.get("measurements", {}),
    )


def _lower(ep: ExportedProgram, keep: set[str] | None, compile_specs, rest: list, etrecord):
    from executorch.exir import to_edge_transform_and_lower

    ours = GuidedPartitioner(compile_specs, candidates=keep)
    edge = to_edge_transform_and_lower(
        ep, partitioner=[ours, *rest], generate_etrecord=etrecord is not None
    )
    program = edge.to_executorch()
    if etrecord is not None:
        # The Inspector names each call's backend from it.
        program.get_etrecord().save(str(etrecord))
    return program, ours.last_candidates


#: The manifest :func:`export_variants` writes beside the programs.
MANIFEST = "variants.json"
#: The script that runs every variant on the target.
RUN_SCRIPT = "run_on_target.sh"
#: Rounds of :data:`RUN_SCRIPT` by default: each runs every variant once.
ROUNDS = 3


def etdump_name(variant: str, round_: int) -> str:
    """The ETDump a variant's run in round ``round_`` (from 1) writes."""
    return f"{variant}.{round_}.etdump"


def export_variants(
    ep: ExportedProgram,
    out_dir: str | Path,
    compile_specs=None,
    rest: list | None = None,
    iters: int = 10,
    threads: int | None = None,
    rounds: int = ROUNDS,
) -> Path:
    """Writes the programs to time (module docs: every candidate delegated,
    each left out, neighbours left out together) into ``out_dir``, with the
    ETRecord of the first, a manifest (:data:`MANIFEST`) and a shell script
    (:data:`RUN_SCRIPT`) that runs each in ``pte_runner`` (``iters`` timed
    iterations) in each of ``rounds`` rounds, writing an ETDump per run
    (:func:`etdump_name`) beside it. Copy the directory to the target, run the script there
    (``PTE_RUNNER=/path/to/pte_runner sh run_on_target.sh``), copy it back
    and pass it as ``GuidedPartitioner(profile=out_dir)``. Returns
    ``out_dir``.

    ``ep`` is the exported (ATen) program; each variant is lowered from it
    (``to_edge_transform_and_lower`` with RustConv first, then ``rest``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rest = rest or []
    program, keys = _lower(ep, None, compile_specs, rest, out / "all.etrecord")
    (out / "all.pte").write_bytes(program.buffer)
    variants = [{"name": "all", "left_out": []}]
    variants += [{"name": f"without_{i}", "left_out": [i]} for i in range(len(keys))]
    variants += [
        {"name": f"without_{i}_{i + 1}", "left_out": [i, i + 1]} for i in range(len(keys) - 1)
    ]
    for variant in variants[1:]:
        keep = set(keys) - {keys[i] for i in variant["left_out"]}
        program, _ = _lower(ep, keep, compile_specs, rest, None)
        (out / f"{variant['name']}.pte").write_bytes(program.buffer)
    manifest = {
        "keys": keys,
        "iterations": iters,
        "rounds": rounds,
        "warmup": WARMUP,
        "threads": threads,
        "rest": [type(p).__name__ for p in rest] or ["ExecuTorch CPU kernels"],
        "variants": variants,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    lines = [
        "#!/bin/sh",
        "# Runs every variant in pte_runner once per round, each writing",
        "# NAME.ROUND.etdump here. Run it on the target",
        "# (PTE_RUNNER=/path/to/pte_runner sh run_on_target.sh), copy the directory",
        "# back and pass it as GuidedPartitioner(profile=<dir>).",
        "set -e",
        'cd "$(dirname "$0")"',
        'RUNNER="${PTE_RUNNER:-pte_runner}"',
        f"for round in {' '.join(str(r) for r in range(1, rounds + 1))}; do",
    ]
    for v in variants:
        args = runner_args(
            f"{v['name']}.pte",
            iters=iters,
            warmup=WARMUP,
            threads=threads,
            etdump=etdump_name(v["name"], "$round"),
        )
        lines.append('    "$RUNNER" ' + " ".join(args) + " > /dev/null")
    lines.append("done")
    script = out / RUN_SCRIPT
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return out


def _manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory} has no {MANIFEST}: not a directory written by export_variants"
        )
    return json.loads(path.read_text())


def run_variants(directory: str | Path) -> None:
    """Runs the variants of ``directory`` on this machine, as
    :data:`RUN_SCRIPT` does on the target."""
    directory = Path(directory)
    manifest = _manifest(directory)
    for round_ in range(1, manifest["rounds"] + 1):
        for v in manifest["variants"]:
            run_pte(
                directory / f"{v['name']}.pte",
                directory / etdump_name(v["name"], round_),
                iters=manifest["iterations"],
                threads=manifest["threads"],
                warmup=manifest["warmup"],
            )


def decide_from_variants(directory: str | Path) -> Decision:
    """The decision from the ETDumps the variants of ``directory`` wrote
    (on the target, or here with :func:`run_variants`)."""
    directory = Path(directory)
    manifest = _manifest(directory)
    keys = manifest["keys"]
    rounds = range(1, manifest["rounds"] + 1)
    missing = [
        etdump_name(v["name"], r)
        for r in rounds
        for v in manifest["variants"]
        if not (directory / etdump_name(v["name"], r)).is_file()
    ]
    if missing:
        raise FileNotFoundError(
            f"{directory} lacks {', '.join(missing)}: run {RUN_SCRIPT} there (on the target) "
            "and copy the ETDumps back"
        )

    def profiles(name: str, etrecord: Path | None = None):
        for r in rounds:
            profile = read_profile(directory / etdump_name(name, r), etrecord)
            profile.drop_first(manifest["warmup"])
            yield profile

    def method_ms(name: str) -> float:
        return min(min(p.method_ms) for p in profiles(name))

    full = list(profiles("all", directory / "all.etrecord"))
    t_all = min(min(p.method_ms) for p in full)
    per_round = [[c for c in p.calls if c.backend == BACKEND_ID] for p in full]
    if any(len(calls) != len(keys) for calls in per_round):
        made = sorted({len(calls) for calls in per_round})
        raise RuntimeError(f"expected {len(keys)} RustConv calls, the program made {made}")
    rustconv_ms = [min(min(calls[i].times_ms) for calls in per_round) for i in range(len(keys))]
    by_left_out = {tuple(v["left_out"]): method_ms(v["name"]) for v in manifest["variants"][1:]}
    without = [by_left_out[(i,)] for i in range(len(keys))]
    pairs = [by_left_out[(i, i + 1)] for i in range(len(keys) - 1)]
    rest_ms = [r + w - t_all for r, w in zip(rustconv_ms, without, strict=True)]
    rest_rest = [p - without[i] - without[i + 1] + t_all for i, p in enumerate(pairs)]
    measurements = {
        "iterations": manifest["iterations"],
        "rounds": manifest["rounds"],
        "threads": manifest["threads"],
        "rest": manifest["rest"],
        "method_ms_all_delegated": t_all,
        "method_ms_without": without,
        "method_ms_without_pair": pairs,
    }
    return decide(keys, rustconv_ms, rest_ms, rest_rest, measurements)


def measure(
    ep: ExportedProgram,
    compile_specs=None,
    rest: list | None = None,
    iters: int = 10,
    threads: int | None = None,
) -> Decision:
    """The on-target loop run on this machine: :func:`export_variants`,
    :func:`run_variants`, :func:`decide_from_variants`."""
    with tempfile.TemporaryDirectory() as tmp:
        export_variants(ep, tmp, compile_specs, rest, iters, threads)
        run_variants(tmp)
        return decide_from_variants(tmp)


def load_profile(profile: str | Path | dict, keys: list[str]) -> Decision:
    """A decision for the candidates ``keys`` from what
    ``GuidedPartitioner(profile=...)`` accepts besides ``"measure"``: a
    directory of variants run on the target, a saved decision file, or its
    dict."""
    if isinstance(profile, dict):
        return from_profile(profile, keys)
    path = Path(profile)
    if path.is_dir():
        decision = decide_from_variants(path)
        if decision.keys != keys:
            raise ValueError(
                f"the variants in {path} were exported from another program (their candidates "
                "differ from this program's)"
            )
        return decision
    return from_profile(json.loads(path.read_text()), keys)


def save(decision: Decision, path: str | Path) -> None:
    Path(path).write_text(json.dumps(decision.to_json(), indent=1))


def lower_guided(
    exported_program: ExportedProgram,
    rest: list | None = None,
    compile_specs=None,
    pte_path: str | Path | None = None,
    decision_path: str | Path | None = None,
    profile: str | Path | dict = "measure",
    iters: int = 10,
    threads: int | None = None,
):
    """The whole loop in one call: export the candidates, run them, decide,
    export the final program (RustConv where it won, then ``rest``).
    Returns the ExecuTorch program (written to ``pte_path`` if given)."""
    from executorch.exir import to_edge_transform_and_lower

    ours = GuidedPartitioner(
        compile_specs,
        profile=profile,
        rest=rest,
        decision_path=decision_path,
        measure_iters=iters,
        measure_threads=threads,
        program=exported_program,
    )
    program = to_edge_transform_and_lower(
        exported_program, partitioner=[ours, *(rest or [])]
    ).to_executorch()
    if pte_path is not None:
        Path(pte_path).write_bytes(program.buffer)
    return program


class GuidedPartitioner(RustConvPartitioner):
    """:class:`rustconv.RustConvPartitioner` taking only the candidates that
    are faster in RustConv (module docs). Used in place of it::

        to_edge_transform_and_lower(
            ep, partitioner=[GuidedPartitioner(profile="decision.json"), XnnpackPartitioner()]
        )

    Args:
        compile_specs, stateful: as :class:`rustconv.RustConvPartitioner`'s.
        profile: a directory of variants run on the target
            (:func:`export_variants`), a decision saved by an earlier run or
            its dict, or ``"measure"`` to time every candidate here,
            delegated and left to ``rest`` (lowered from ``program``, the
            exported ATen program). The decision is printed.
        rest: the partitioners that follow this one (what a candidate is
            left to when measuring; none: ExecuTorch's CPU kernels).
        decision_path: where to save the decision and its measurements (JSON,
            readable back as ``profile``).
        measure_iters, measure_threads: pte_runner iterations and threads
            for ``profile="measure"``.
        candidates: take only these candidates (keys from
            :func:`candidate_keys`); used by the measurements.
    """

    def __init__(
        self,
        compile_specs: list[CompileSpec] | None = None,
        *,
        profile: str | Path | dict | None = None,
        rest: list[Partitioner] | None = None,
        decision_path: str | Path | None = None,
        measure_iters: int = 10,
        measure_threads: int | None = None,
        candidates: set[str] | None = None,
        program: ExportedProgram | None = None,
        stateful: bool = True,
    ) -> None:
        super().__init__(compile_specs, stateful=stateful)
        self.profile = profile
        self.rest = list(rest or [])
        self.decision_path = decision_path
        self.measure = {"iters": measure_iters, "threads": measure_threads}
        self.candidates = candidates
        self.program = program
        if profile == "measure" and program is None:
            raise ValueError(
                'profile="measure" lowers variants of the exported program: pass it as '
                "program=, or use rustconv.guided.lower_guided"
            )
        #: The last decision (:class:`Decision`).
        self.decision: Decision | None = None

    def _may_leave_out(self) -> bool:
        return self.profile is not None or self.candidates is not None

    def _chosen(self, exported_program: ExportedProgram) -> set[str] | None:
        if self.candidates is not None:
            return self.candidates
        if self.profile is None:
            return None
        if self.profile == "measure":
            decision = measure(self.program, self.compile_specs, self.rest, **self.measure)
            self.profile = decision.to_json()  # measured once, even if called again
            if decision.keys != candidate_keys(exported_program):
                raise ValueError("the measured candidates differ from this program's")
        else:
            decision = load_profile(self.profile, candidate_keys(exported_program))
        print(decision.format())
        if self.decision_path is not None:
            save(decision, self.decision_path)
        self.decision = decision
        return decision.delegated()
