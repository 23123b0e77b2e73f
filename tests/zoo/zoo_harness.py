"""Lowering and running a zoo model the way a user would: export,
``to_edge_transform_and_lower`` with ``[RustConvPartitioner(),
XnnpackPartitioner()]``, run in ``executorch.runtime`` and in pte_runner,
compare with eager at 1e-4 times each output's scale.

Streaming models carry state one of two ways (zoo_models.Example):

* in the module's buffers (a mutated buffer, ``cat`` + ``copy_``): one
  program, its calls made in order on one loaded method (pte_runner:
  ``-steps_npz_paths``);
* in the inputs and outputs (SileroVAD's LSTM state, Mimi's padding cache):
  the steps' inputs already hold eager's chained state, and a call whose
  input shapes differ from the prefill's (a decode hop) gets a program of
  its own, exported at those shapes.
"""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from conftest import pte_runner_path
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import (
    EdgeCompileConfig,
    EdgeProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)
from executorch.runtime import Runtime
from rustconv import RustConvPartitioner
from rustconv.devtools.testing import Lowering, lower_and_survey
from torch.export import export
from zoo_models import Example, delegate_calls, flatten, tolerance

NOT_OURS = re.compile(r"^(\S+) is not a RustConv op")
#: Node names inside reasons ("an operand of aten_convolution_default_2"),
#: replaced so one reason reads the same for every layer.
NODE_NAME = re.compile(r"\b(aten|dim_order_ops|getitem)_\w+")


@dataclass
class Program:
    """One lowered program and the calls (indices into prefill + steps) it serves."""

    pte: Path
    calls: list[int]
    rustconv_calls: int
    xnnpack_calls: int
    ops: list[str]  # operators the program runs outside any delegate


@dataclass
class Lowered:
    example: Example
    outside: dict[str, list[str]]  # explain(), grouped (see outside_summary)
    eager: list[list[torch.Tensor]] = field(default_factory=list)
    _programs: list[Program] = field(default_factory=list)
    error: BaseException | None = None  # lowering failed (export and explain did not)
    # The default lowering ([RustConv, XNNPACK]) of the first program, surveyed
    # for rule one (test_rule_one_invariance takes it rather than lowering again).
    first: Lowering | None = None

    @property
    def programs(self) -> list[Program]:
        if self.error is not None:
            raise self.error
        return self._programs

    @property
    def all_calls(self) -> list[tuple]:
        return [self.example.inputs, *self.example.steps]


def signature(inputs: tuple) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in inputs)


def state_in_buffers(ep) -> bool:
    return bool(ep.graph_signature.buffers_to_mutate)


def outside_summary(edge_program) -> dict[str, list[str]]:
    """``RustConvPartitioner().explain()``, grouped by what a model's entry
    declares: every op that is not a RustConv op, under its name; and, for
    every convolution and the nodes next to a 1-D one (its operands and
    users), any other reason as "op: reason" (node names in it generalised).
    Reasons elsewhere (integer index arithmetic, attention's 5-D views, an
    elementwise op with no conv near it) are left out: they say nothing
    about the convs. Values: the nodes."""
    reasons = RustConvPartitioner().explain(edge_program)
    nodes = {n.name: n for n in edge_program.graph.nodes if n.op == "call_function"}
    near_conv = set()
    for n in nodes.values():
        if "convolution" not in str(n.target):
            continue
        near_conv.add(n.name)  # every convolution: why it is not ours, if it is not
        # The neighbours of a 1-D one (one RustConv could run, transposed too).
        if len(n.args[3]) == 1:
            near_conv.update(a.name for a in n.all_input_nodes)
            near_conv.update(u.name for u in n.users)
    groups: dict[str, list[str]] = defaultdict(list)
    for name, why in reasons.items():
        node = nodes.get(name)
        op = getattr(node.target, "__name__", str(node.target)) if node is not None else "?"
        match = NOT_OURS.match(why)
        if match:
            groups[match.group(1)].append(name)
        elif name in near_conv:
            groups[f"{op}: {NODE_NAME.sub('<node>', why)}"].append(name)
    return dict(groups)


def lower(example: Example, out_dir: Path, partitioners=None) -> Lowered:
    """Exports the example, explains it, and lowers it: one program for a
    buffer-state model, one per distinct input signature for the others. A
    lowering failure is kept in ``error`` (raised by ``programs``)."""
    default = partitioners is None
    partitioners = partitioners or (lambda: [RustConvPartitioner(), XnnpackPartitioner()])
    calls = [example.inputs, *example.steps]

    def exported():
        return export(
            example.module,
            example.inputs,
            dynamic_shapes=example.dynamic_shapes,
            strict=example.strict,
        )

    config = EdgeCompileConfig(**(example.edge_compile_config or {}))
    # Each flow gets its own export: to_edge leaves an exported program that
    # to_edge_transform_and_lower cannot take again (its decompositions lose
    # track of unbacked sizes, such as voxtral's .item() positions).
    lowered = Lowered(
        example,
        outside_summary(to_edge(exported(), compile_config=config).exported_program()),
        example.eager_outputs(),
    )
    ep = exported()
    groups: dict[tuple, list[int]] = {}
    if state_in_buffers(ep) or example.dynamic_shapes is not None:
        groups[signature(example.inputs)] = list(range(len(calls)))
    else:
        for i, inputs in enumerate(calls):
            groups.setdefault(signature(inputs), []).append(i)
    try:
        for k, indices in enumerate(groups.values()):
            if k:
                ep = export(example.module, calls[indices[0]], strict=example.strict)

            def lower_this(partitioners: list, ep=ep) -> EdgeProgramManager:
                return to_edge_transform_and_lower(
                    ep, partitioner=partitioners, compile_config=config
                )

            if k == 0 and default:
                lowered.first = lower_and_survey("first", lower_this, partitioners())
                et = lowered.first.executorch_program()
            else:
                et = lower_this(partitioners()).to_executorch()
            pte = out_dir / f"program{k}.pte"
            pte.write_bytes(et.buffer)
            plan = et.executorch_program.execution_plan[0]
            lowered._programs.append(
                Program(
                    pte,
                    indices,
                    delegate_calls(et, "RustConvBackend"),
                    delegate_calls(et, "XnnpackBackend"),
                    sorted({op.name for op in plan.operators}),
                )
            )
    except Exception as e:  # noqa: BLE001  (kept: the explain checks still run)
        lowered.error = e
    return lowered


def compare(got: list, want: list[torch.Tensor], what: str) -> list[str]:
    """Mismatches of every output at 1e-4 times its scale, as messages."""
    if len(got) != len(want):
        return [f"{what}: {len(got)} outputs, eager has {len(want)}"]
    problems = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g = torch.as_tensor(np.asarray(g))
        if tuple(g.shape) != tuple(w.shape):
            problems.append(f"{what} output {i}: shape {tuple(g.shape)} != {tuple(w.shape)}")
            continue
        err = float((g.double() - w.double()).abs().max()) if w.numel() else 0.0
        if not err <= tolerance(w):  # NaN fails too
            problems.append(
                f"{what} output {i} {tuple(w.shape)}: max error {err:.3e} > "
                f"{tolerance(w):.3e} (1e-4 x scale {tolerance(w) * 1e4:.3g})"
            )
    return problems


def call_name(i: int) -> str:
    return "prefill" if i == 0 else f"decode step {i}"


def run_in_runtime(lowered: Lowered) -> list[str]:
    """Every call in executorch.runtime, calls of one program on one loaded
    method in order; mismatch messages."""
    problems = []
    for program in lowered.programs:
        method = Runtime.get().load_program(str(program.pte)).load_method("forward")
        for i in program.calls:
            got = flatten(tuple(method.execute(list(lowered.all_calls[i]))))
            problems += compare(got, lowered.eager[i], f"executorch.runtime, {call_name(i)}")
    return problems


def run_in_pte_runner(lowered: Lowered, work: Path, threads: int = 2) -> list[str]:
    """Every call in pte_runner: a program's calls as one -steps_npz_paths
    sequence (state carried between them); mismatch messages."""
    problems = []
    for k, program in enumerate(lowered.programs):
        files = []
        for i in program.calls:
            path = work / f"p{k}-call{i}.npz"
            np.savez(path, **{str(j): t.numpy() for j, t in enumerate(lowered.all_calls[i])})
            files.append(str(path))
        out = work / f"p{k}-out.npz"
        run = subprocess.run(
            [str(pte_runner_path()), "-model_path", str(program.pte), "-steps_npz_paths",
             ",".join(files), "-output_npz_path", str(out), "-num_threads", str(threads)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if run.returncode != 0:
            problems.append(f"pte_runner failed (exit {run.returncode}): {run.stderr[-1500:]}")
            continue
        for n, i in enumerate(program.calls):
            with np.load(out.with_name(f"{out.stem}.{n}.npz")) as arrays:
                got = [arrays[str(j)] for j in range(len(arrays.files))]
            problems += compare(got, lowered.eager[i], f"pte_runner, {call_name(i)}")
    return problems
