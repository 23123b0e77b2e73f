"""One program through both lowering flows and both runners, against eager.

For a program (see :mod:`difftest.spec`):

1. eager, in the graph's dtype and in float64 (the reference), call after
   call (buffers carry state between calls as the model's ``copy_`` says);
   a graph whose eager output is not finite or not O(1) is *invalid* (the
   generator's fault, not a test) and dropped, and so is one torch.export
   refuses;
2. ``torch.export`` once per flow, then
   * ``edge``: ``to_edge(ep).to_backend(RustConvPartitioner())``;
   * ``xnn``: ``to_edge_transform_and_lower(ep, partitioner=[RustConvPartitioner(),
     XnnpackPartitioner()])``;
   each checked for its number of RustConvBackend calls against
   :func:`rustconv.export.partition_proposal.propose` on the program the
   partitioner was given, and the nodes of RustConv's kinds it refused
   recorded with ``explain()``'s reasons;
3. each ``.pte`` run in ``executorch.runtime`` (a child process,
   :mod:`difftest.executor`) and in ``pte_runner`` (every call of the
   program in one invocation, ``-steps_npz_paths``), and every output
   compared with the reference (:func:`compare`).

A failure says which graph it belongs to where it can (an output's
mismatch); a failure of the whole program (an exception while lowering, a
crash, a wrong call count) has ``graph=None`` and is attributed by shrinking
(:mod:`difftest.shrink`).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from difftest.ops import operands
from difftest.spec import (
    DiffModel,
    call_inputs,
    dynamic_shapes,
    example_inputs,
    n_calls,
    output_owner,
    subset,
)

__all__ = [
    "FLOWS",
    "RUNNERS",
    "TOLERANCE",
    "Failure",
    "Result",
    "Checker",
    "compare",
    "output_dtype",
]

FLOWS = ("edge", "xnn")
RUNNERS = ("runtime", "pte_runner")

#: dtype -> (relative to the output's scale, absolute floor). See compare().
TOLERANCE = {
    "float32": (1e-4, 1e-5),
    "float16": (2e-3, 1e-3),
    # 4 half-ulps of the scale and one ulp of 1.0, as float16's (8 bits).
    "bfloat16": (1.6e-2, 7.8e-3),
}
#: Float dtypes from the most to the fewest significand bits.
_PRECISION = ("float64", "float32", "float16", "bfloat16")
#: How many times eager's own error (against float64) a result may be off by.
CONDITIONING = 4.0
#: An eager output larger than this (or not finite) makes its graph invalid.
MAX_MAGNITUDE = 1e4
#: A comparison whose operands come closer than this (in the float64
#: reference) makes its graph invalid: rounding in any implementation (an FFT
#: conv, a fused kernel, eager itself) may flip it, and a flipped mask is a
#: different output, not an error. About 100 float32 ulps of 1.0, and 2
#: float16 ulps (a delegate computing float16 in float32 within a kernel
#: differs from eager, rounding after every op, by about that much).
COMPARISON_MARGIN = {"float32": 1e-5, "float16": 2e-3}

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Failure:
    kind: str  # mismatch | lower_error | run_error | crash | timeout | count | shape
    flow: str
    runner: str | None = None
    graph: int | None = None  # index in the program; None: the whole program
    output: int | None = None  # index among the graph's outputs
    call: int | None = None
    detail: str = ""
    numbers: dict = field(default_factory=dict)

    @property
    def signature(self) -> str:
        return f"{self.kind}:{self.flow}:{self.runner or '-'}"

    def describe(self) -> str:
        where = "program" if self.graph is None else f"graph {self.graph}"
        if self.output is not None:
            where += f" output {self.output}"
        if self.call is not None:
            where += f" call {self.call}"
        text = f"{self.signature} ({where}): {self.detail}"
        return text[:2000]


@dataclass
class Result:
    program: dict
    failures: list[Failure] = field(default_factory=list)
    invalid: dict[int, str] = field(default_factory=dict)  # original graph index -> why
    kept: list[int] = field(default_factory=list)  # original indices of the graphs tested
    proposed: dict[str, int] = field(default_factory=dict)
    delegates: dict[str, int] = field(default_factory=dict)
    refused: Counter = field(default_factory=Counter)
    anchors: Counter = field(default_factory=Counter)  # taken / refused convs and scans
    times: dict[str, float] = field(default_factory=dict)

    @property
    def models(self) -> int:
        return len(self.kept)

    def to_json(self) -> dict:
        return {
            "failures": [asdict(f) for f in self.failures],
            "invalid": self.invalid,
            "proposed": self.proposed,
            "delegates": self.delegates,
            "refused": dict(self.refused),
            "times": self.times,
        }


def compare(got: Any, eager: torch.Tensor, ref: torch.Tensor, dtype: str) -> dict | None:
    """None if ``got`` matches; else the numbers of the worst element.

    The reference is the model in float64 on the same (rounded) parameters
    and inputs. An element may be off by
    ``rel * scale + floor + CONDITIONING * |eager - reference|``, where
    ``scale`` is the output's largest magnitude: ``rel`` is the issue's 1e-4
    in float32; ``floor`` (1e-5, ~80 float32 ulps of 1.0) covers an output
    much smaller than the values it was computed from (a conv summing up to
    a couple of thousand O(1) products, then cancelling); the last term
    covers ill-conditioned outputs, where eager itself is that far from the
    exact result and a different but equally good summation order (FFT,
    fused kernels) lands elsewhere. In float16, values are stored with 11
    bits: ``rel`` 2e-3 is 4 half-ulps of the output's scale and ``floor``
    1e-3 one ulp of 1.0; eager float16 (rounding after every op) is usually
    further off than the delegate (computing in float32 within a kernel),
    and the conditioning term follows it. ``dtype`` is the output's, from
    :func:`output_dtype` (bfloat16 after a cast to it, with float16's rule).
    """
    got = np.asarray(got, dtype=np.float64)
    want = ref.detach().double().numpy()
    mine = eager.detach().double().numpy()
    if got.shape != want.shape:
        return {"shape": list(got.shape), "expected_shape": list(want.shape)}
    rel, floor = TOLERANCE[dtype]
    finite = np.isfinite(mine)
    if not finite.all():
        same = (np.isnan(got) & np.isnan(mine)) | (got == mine)
        if not same[~finite].all():
            index = np.argwhere(~finite & ~same)[0]
            return {
                "index": index.tolist(),
                "got": float(got[tuple(index)]),
                "eager": float(mine[tuple(index)]),
                "nonfinite": True,
            }
    scale = float(np.abs(want[finite]).max()) if finite.any() else 0.0
    tol = rel * scale + floor + CONDITIONING * np.abs(mine - want)
    err = np.abs(got - want)
    err = np.where(finite, err, 0.0)
    err = np.where(np.isnan(err), np.inf, err)
    bad = err > tol
    if not bad.any():
        return None
    index = np.unravel_index(int(np.argmax(err - tol)), err.shape)
    return {
        "index": [int(i) for i in index],
        "max_err": float(err.max()),
        "err": float(err[index]),
        "tol": float(tol[index]),
        "scale": scale,
        "got": float(got[index]),
        "reference": float(want[index]),
        "eager": float(mine[index]),
        "bad": int(bad.sum()),
        "of": int(bad.size),
    }


def output_dtype(graph: dict, name: str) -> str:
    """The dtype whose tolerance output ``name`` is compared with: the graph's
    own, or the narrowest float dtype a computed value on its way was cast to.

    A computed value that lies within float32 rounding of a float16 rounding
    midpoint rounds to either neighbour in equally good implementations (a
    different summation order), and the reference rounds where the model
    does, so the conditioning term does not cover it: the output may be one
    float16 ulp off (seed 43009, kept in regressions/). A cast of a leaf is
    exact everywhere and does not count.
    """
    producer = {out: op for op in graph["ops"] for out in op.get("outs") or [op.get("out")]}
    narrowest = _PRECISION.index(graph["dtype"])
    seen, todo = set(), [name]
    while todo:
        op = producer.get(todo.pop())
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        if op["op"] == "cast" and op["x"] in producer and op["to"] in _PRECISION:
            narrowest = max(narrowest, _PRECISION.index(op["to"]))
        todo.extend(operands(op))
    return _PRECISION[narrowest]


class _Invalid(Exception):
    def __init__(self, graphs: dict[int, str]) -> None:
        super().__init__(graphs)
        self.graphs = graphs


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    text = re.sub(r"\s+", " ", text)
    return text[:600]


def _short_traceback(e: BaseException) -> str:
    lines = traceback.format_exception(e)
    tail = "".join(lines[-12:])
    return tail[-3000:]


def reason_template(reason: str) -> str:
    """A refusal reason without node names, for counting reasons."""
    text = re.sub(r"\b[a-z_]+_\d+\b", "…", reason)
    text = re.sub(r"\(\d+(, \d+)*\)", "(…)", text)
    text = re.sub(r"\d+", "#", text)
    return text[:160]


class Checker:
    """Checks programs; holds the executorch.runtime child and a work folder."""

    def __init__(
        self,
        workdir: str | Path,
        flows: tuple[str, ...] = FLOWS,
        runners: tuple[str, ...] = RUNNERS,
        executor: Any = None,
        pte_runner: str | None = None,
        keep_pte: bool = False,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.flows = flows
        self.runners = runners
        self._executor = executor
        self.pte_runner = pte_runner or os.environ.get(
            "PTE_RUNNER", str(ROOT / "target" / "release" / "pte_runner")
        )
        self.keep_pte = keep_pte
        self._tag = 0
        self._margins: list[float] = []

    @property
    def executor(self):
        if self._executor is None:
            from difftest.executor import Executor

            self._executor = Executor()
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()

    # -- the whole check --------------------------------------------------

    def check(
        self,
        program: dict,
        flows: tuple[str, ...] | None = None,
        runners: tuple[str, ...] | None = None,
        baseline: bool = False,
    ) -> Result:
        """Runs the checks; ``baseline=True`` lowers *without* RustConv (to tell
        a failure of ours from one of ExecuTorch's or XNNPACK's)."""
        flows = flows or self.flows
        runners = self.runners if runners is None else runners
        original = list(range(len(program["graphs"])))
        result = Result(program=program)
        kept = original
        for _ in range(len(original) + 1):
            try:
                sub = subset(program, kept)
                self._check(sub, kept, result, flows, runners, baseline)
                break
            except _Invalid as e:
                for i, why in e.graphs.items():
                    result.invalid[kept[i]] = why
                kept = [g for i, g in enumerate(kept) if i not in e.graphs]
                for part in (result.failures, result.proposed, result.delegates):
                    part.clear()
                result.refused.clear()
                result.anchors.clear()
                if not kept:
                    break
        result.kept = kept
        for f in result.failures:
            if f.graph is not None:
                f.graph = kept[f.graph]
        return result

    def _check(self, program, kept, result, flows, runners, baseline) -> None:
        t0 = time.perf_counter()
        eager, ref = self._eager(program)
        result.times["eager"] = time.perf_counter() - t0
        calls = [call_inputs(program, k) for k in range(n_calls(program))]
        owners = output_owner(program)
        for flow in flows:
            t0 = time.perf_counter()
            try:
                pte, proposed, delegates, refused, anchors = self._lower(program, flow, baseline)
            except _Invalid:
                raise
            except Exception as e:  # noqa: BLE001  (an exception is a finding)
                result.failures.append(
                    Failure(
                        "lower_error",
                        flow,
                        detail=_short(e),
                        numbers={"traceback": _short_traceback(e)},
                    )
                )
                continue
            finally:
                result.times[f"lower_{flow}"] = time.perf_counter() - t0
            result.proposed[flow] = proposed
            result.delegates[flow] = delegates
            result.refused.update(refused)
            if flow == "edge":
                result.anchors.update(anchors)
            if not baseline and proposed != delegates:
                result.failures.append(
                    Failure(
                        "count",
                        flow,
                        detail=f"{delegates} RustConvBackend calls, {proposed} proposed",
                        numbers={"proposed": proposed, "delegates": delegates},
                    )
                )
            self._tag += 1
            path = self.workdir / f"p{os.getpid()}_{self._tag}_{flow}.pte"
            path.write_bytes(pte)
            try:
                for runner in runners:
                    t0 = time.perf_counter()
                    status, outputs = self._run(runner, path, calls, program.get("threads", 2))
                    result.times[f"run_{flow}_{runner}"] = time.perf_counter() - t0
                    if status != "ok":
                        kind = {"error": "run_error"}.get(status, status)
                        result.failures.append(Failure(kind, flow, runner, detail=outputs))
                        continue
                    self._compare(program, owners, outputs, eager, ref, flow, runner, result)
            finally:
                if not self.keep_pte:
                    path.unlink(missing_ok=True)

    # -- eager ------------------------------------------------------------

    def _eager(self, program: dict):
        """Outputs per call of the model in its dtype and of the float64 reference."""
        ncalls = n_calls(program)
        try:
            eager = _run_eager(DiffModel(program), [call_inputs(program, k) for k in range(ncalls)])
            reference = DiffModel(program, reference=True)
            ref = _run_eager(
                reference,
                [call_inputs(program, k, reference=True) for k in range(ncalls)],
                margins=self._margins,
            )
        except Exception:  # noqa: BLE001
            bad = {}
            for gi in range(len(program["graphs"])):
                one = subset(program, [gi])
                try:
                    _run_eager(DiffModel(one), [call_inputs(one, k) for k in range(ncalls)])
                except Exception as e:  # noqa: BLE001
                    bad[gi] = f"eager: {_short(e)}"
                    continue
                try:
                    _run_eager(
                        DiffModel(one, reference=True),
                        [call_inputs(one, k, reference=True) for k in range(ncalls)],
                        margins=[],
                    )
                except Exception as e:  # noqa: BLE001
                    # A reference the harness cannot build drops the graph
                    # (named in the summary) instead of ending the run.
                    bad[gi] = f"reference: {_short(e)}"
            if not bad:
                raise
            raise _Invalid(bad) from None
        owners = output_owner(program)
        bad = {}
        for gi, margin in enumerate(self._margins):
            threshold = COMPARISON_MARGIN[program["graphs"][gi]["dtype"]]
            if margin < threshold:
                bad[gi] = f"a comparison within {margin:.2g} of its threshold"
        for outs in eager:
            for (gi, _), out in zip(owners, outs, strict=True):
                values = out.detach().double()
                if not torch.isfinite(values).all():
                    bad[gi] = "eager output not finite"
                elif values.numel() and values.abs().max() > MAX_MAGNITUDE:
                    bad[gi] = f"eager output too large ({values.abs().max():.3g})"
        if bad:
            raise _Invalid(bad)
        return eager, ref

    # -- export and lowering ----------------------------------------------

    def _export(self, program: dict):
        from torch.export import export

        model = DiffModel(program).eval()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return export(
                    model, example_inputs(program), dynamic_shapes=dynamic_shapes(program)
                )
        except Exception as e:  # noqa: BLE001
            if len(program["graphs"]) == 1:
                raise _Invalid({0: f"export: {_short(e)}"}) from None
            bad = {}
            for gi in range(len(program["graphs"])):
                one = subset(program, [gi])
                try:
                    export(
                        DiffModel(one).eval(),
                        example_inputs(one),
                        dynamic_shapes=dynamic_shapes(one),
                    )
                except Exception as e1:  # noqa: BLE001
                    bad[gi] = f"export: {_short(e1)}"
            if not bad:
                raise
            raise _Invalid(bad) from None

    def _lower(self, program: dict, flow: str, baseline: bool):
        """(.pte bytes, proposed RustConv calls, RustConv calls, refusal reasons, anchors)."""
        from executorch.exir import to_edge, to_edge_transform_and_lower
        from rustconv import RustConvPartitioner
        from rustconv.export.partition_proposal import propose

        ep = self._export(program)
        refused: Counter = Counter()
        anchors: Counter = Counter()
        recorded: list[int] = []

        def record(proposal) -> None:
            recorded.append(len(proposal.partitions))
            from rustconv.export.ops_lowering import lowering_for

            taken = proposal.taken()
            for node, reason in proposal.rejected.items():
                lowering = lowering_for(node)
                if lowering is None:
                    continue  # not one of our kinds: "aten.mm is not a RustConv op"
                refused[f"{lowering.kind}: {reason_template(reason)}"] += 1
                if lowering.is_anchor:
                    anchors[f"{lowering.kind} refused"] += 1
            for node in taken:
                lowering = lowering_for(node)
                if lowering is not None and lowering.is_anchor:
                    anchors[f"{lowering.kind} taken"] += 1

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if flow == "edge":
                edge = to_edge(ep)
                if not baseline:
                    record(propose(edge.exported_program()))
                    edge = edge.to_backend(RustConvPartitioner())
            else:
                from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
                    XnnpackPartitioner,
                )

                class Recording(RustConvPartitioner):
                    def partition(self, exported_program):
                        record(propose(exported_program))
                        return super().partition(exported_program)

                partitioners = [XnnpackPartitioner()]
                if not baseline:
                    partitioners.insert(0, Recording())
                edge = to_edge_transform_and_lower(ep, partitioner=partitioners)
            et = edge.to_executorch()
        plan = et.executorch_program.execution_plan[0]
        delegates = sum(1 for d in plan.delegates if d.id == "RustConvBackend")
        return et.buffer, sum(recorded), delegates, refused, anchors

    # -- running ----------------------------------------------------------

    def _run(self, runner: str, path: Path, calls: list[list[torch.Tensor]], threads: int):
        arrays = [[t.numpy() for t in call] for call in calls]
        if runner == "runtime":
            return self.executor.run(str(path), arrays)
        stem = path.with_suffix("")
        inputs = []
        for k, call in enumerate(arrays):
            p = Path(f"{stem}_in{k}.npz")
            np.savez(p, **{str(i): a for i, a in enumerate(call)})
            inputs.append(p)
        out = Path(f"{stem}_out.npz")
        cmd = [
            self.pte_runner,
            "-model_path", str(path),
            "-steps_npz_paths", ",".join(map(str, inputs)),
            "-output_npz_path", str(out),
            "-num_threads", str(threads),
        ]  # fmt: skip
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return "timeout", "pte_runner: no result after 120 s"
        finally:
            for p in inputs:
                p.unlink(missing_ok=True)
        if run.returncode != 0:
            kind = "crash" if run.returncode < 0 else "error"
            # ExecuTorch's error lines and pte_runner's last word, not its info log.
            lines = [
                line
                for line in run.stderr.splitlines()
                if line.startswith(("E ", "pte_runner:", "thread", "fatal", "Error"))
            ]
            text = "\n".join(lines[-12:]) or run.stderr.strip()[-1500:]
            return kind, f"pte_runner exit {run.returncode}: {text}"
        outputs = []
        for k in range(len(arrays)):
            p = Path(f"{stem}_out.{k}.npz")
            with np.load(p) as data:
                outputs.append([data[str(i)] for i in range(len(data.files))])
            p.unlink(missing_ok=True)
        return "ok", outputs

    def _compare(self, program, owners, outputs, eager, ref, flow, runner, result) -> None:
        for k, (got_k, eager_k, ref_k) in enumerate(zip(outputs, eager, ref, strict=True)):
            if len(got_k) != len(eager_k):
                result.failures.append(
                    Failure(
                        "shape",
                        flow,
                        runner,
                        call=k,
                        detail=f"{len(got_k)} outputs, expected {len(eager_k)}",
                    )
                )
                continue
            seen: set[int] = set()
            for (gi, oi), got, e, r in zip(owners, got_k, eager_k, ref_k, strict=True):
                if gi in seen:
                    continue  # one failure per graph and call is enough
                graph = program["graphs"][gi]
                numbers = compare(got, e, r, output_dtype(graph, graph["outputs"][oi]))
                if numbers is None:
                    continue
                seen.add(gi)
                kind = "shape" if "shape" in numbers else "mismatch"
                if kind == "shape":
                    detail = f"shape {numbers['shape']}, expected {numbers['expected_shape']}"
                elif numbers.get("nonfinite"):
                    detail = f"got {numbers['got']} where eager has {numbers['eager']}"
                else:
                    detail = (
                        f"max error {numbers['max_err']:.3g} at {numbers['index']} "
                        f"(tolerance there {numbers['tol']:.3g}, scale {numbers['scale']:.3g}, "
                        f"{numbers['bad']}/{numbers['of']} elements off)"
                    )
                result.failures.append(
                    Failure(
                        kind,
                        flow,
                        runner,
                        graph=gi,
                        output=oi,
                        call=k,
                        detail=detail,
                        numbers=numbers,
                    )  # fmt: skip
                )


def _run_eager(model: torch.nn.Module, calls: list[list[torch.Tensor]], margins=None):
    """Outputs per call of a fresh copy of ``model`` (its buffers carry state
    from call to call); ``margins`` receives the reference's comparison margins."""
    model = copy.deepcopy(model).eval()
    outputs = []
    # Without oneDNN: torch 2.14.1's float16 depthwise conv1d through it
    # (x [2, 12, 71], w [12, 1, 31], groups 12) never returns on AVX-512
    # CPUs, generating its JIT kernel; the native kernels return at once and
    # are the reference either way (tests/test_difftest.py).
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for inputs in calls:
            outputs.append(list(model(*inputs)))
    if margins is not None:
        margins[:] = model.margins
    return outputs
