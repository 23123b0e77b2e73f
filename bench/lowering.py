"""Lowering a setting's model to a .pte per alternative, with a cache.

* ours: ``to_edge(export(m)).to_backend(RustConvPartitioner(specs))``, where
  specs is empty (the runtime's cost model picks) or
  ``[rustconv.compile_specs.algorithm(name)]`` to force one candidate;
* xnnpack: ``to_edge_transform_and_lower(export(m), [XnnpackPartitioner()])``;
* et_cpu: ``to_edge(export(m)).to_executorch()``, no delegate.

Blocks (``rustconv.examples.blocks``) have their linears, so there ours is
``to_edge_transform_and_lower(export(m), [RustConvPartitioner(specs),
XnnpackPartitioner()])`` (``ours_unfused``: specs ``[compile_specs.fusion(False)]``).
Zoo models likewise (bench/zoo.py; ExecuTorch's LFM2 recipes through their
own export, RustConv first for ours, as shipped for xnnpack).

All are serialized with ``MemoryPlanningPass(alloc_graph_input=False)``
unless ``planned_inputs`` is set: the method then reads its inputs where the
caller put them instead of copying them into planned memory, so pte_runner's
"peak memory above the inputs" holds no second copy of the inputs, as for the
in-process alternatives (ExecuTorch's default plans the inputs and copies
them; ``--planned-inputs`` measures that instead).

A .pte is cached under ``<cache>/pte/<setting>/`` keyed by the alternative,
the torch/executorch versions, the seed and, for ours, a hash of the export
side's sources (for blocks always: the block modules live there), so a changed
partitioner or serializer re-exports. A JSON sidecar keeps the delegate ids,
the number of delegate calls per backend (``DelegateCall`` instructions of
the program, i.e. ``executorch_call_delegate`` nodes of the lowered graph) and
the ops left outside them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch
from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
from executorch.exir.passes import MemoryPlanningPass
from torch.export import export

from bench.workload import SettingData

PARTITIONER_DIR = Path(__file__).resolve().parents[1] / "partitioner_py" / "rustconv"
WORKLOAD_OPS = ("convolution", "linear_scan")


@cache
def _export_side_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(PARTITIONER_DIR.rglob("*.py")):
        h.update(str(path.relative_to(PARTITIONER_DIR)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _versions() -> str:
    try:
        et = importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        et = "?"
    return f"torch {torch.__version__} executorch {et}"


@dataclass
class Lowered:
    pte: Path
    delegates: list[str]
    ops_outside: list[str]  # workload ops (conv, scan) the program runs outside any delegate
    lower_s: float
    cached: bool
    delegate_calls: dict[str, int] | None = None  # backend id -> DelegateCall instructions

    def calls(self, backend: str) -> int:
        calls = self.delegate_calls
        if calls is None:
            return self.delegates.count(backend)
        return calls.get(backend, 0)

    def delegated_to(self, backend: str) -> bool:
        return backend in self.delegates and not self.ops_outside

    def describe(self) -> str:
        if not self.delegates:
            return "no delegate"
        text = ",".join(sorted(set(self.delegates)))
        if self.ops_outside:
            text += f" (outside: {','.join(self.ops_outside)})"
        return text


def _lower(alt: str, data: SettingData, planned_inputs: bool, cache_dir: Path):
    config = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=planned_inputs)
    )
    if data.setting.kind == "zoo":
        from bench import zoo

        work = cache_dir / "zoo-recipes" / str(data.setting.size)
        return zoo.lower(alt, data.zoo, work, config)
    model, inputs = data.model(), data.torch_inputs()
    ep = export(model, inputs)
    if data.setting.kind == "blocks" and (alt in ("ours", "ours_unfused") or alt[:5] == "ours:"):
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from rustconv import RustConvPartitioner, compile_specs

        specs = [compile_specs.fusion(False)] if alt == "ours_unfused" else []
        if alt.startswith("ours:"):
            specs = [compile_specs.algorithm(alt.split(":", 1)[1])]
        partitioners = [RustConvPartitioner(compile_specs=specs), XnnpackPartitioner()]
        lowered = to_edge_transform_and_lower(ep, partitioner=partitioners)
        return lowered.to_executorch(config)
    if alt == "et_cpu":
        return to_edge(ep).to_executorch(config)
    if alt == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )

        lowered = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        return lowered.to_executorch(config)
    if alt == "ours" or alt.startswith("ours:"):
        from rustconv import RustConvPartitioner

        specs = []
        if alt.startswith("ours:"):
            from rustconv import compile_specs

            if not hasattr(compile_specs, "algorithm"):
                raise RuntimeError("rustconv.compile_specs.algorithm is not available")
            specs = [compile_specs.algorithm(alt.split(":", 1)[1])]
        lowered = to_edge(ep).to_backend(RustConvPartitioner(compile_specs=specs))
        return lowered.to_executorch(config)
    raise ValueError(f"no lowering for {alt}")


def lowered_pte(
    alt: str, data: SettingData, seed: int, cache_dir: Path, planned_inputs: bool = False
) -> Lowered:
    key = f"{alt}|{_versions()}|seed {seed}|planned inputs {planned_inputs}"
    if alt.startswith("ours") or data.setting.kind in ("blocks", "zoo"):
        key += f"|export side {_export_side_hash()}"
    if data.setting.kind == "zoo":
        from bench import zoo

        key += f"|zoo {zoo.sources_hash()}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    folder = cache_dir / "pte" / data.setting.key(seed)
    pte = folder / f"{alt.replace(':', '-')}-{digest}.pte"
    sidecar = pte.with_suffix(".json")
    if pte.is_file() and sidecar.is_file():
        info = json.loads(sidecar.read_text())
        return Lowered(
            pte,
            info["delegates"],
            info["ops_outside"],
            info["lower_s"],
            True,
            info.get("delegate_calls"),
        )

    t0 = time.perf_counter()
    program = _lower(alt, data, planned_inputs, cache_dir)
    plan = program.executorch_program.execution_plan[0]
    delegates = [d.id for d in plan.delegates]
    calls: dict[str, int] = {}
    for chain in plan.chains:
        for instruction in chain.instructions:
            args = instruction.instr_args
            if type(args).__name__ == "DelegateCall":
                backend = delegates[args.delegate_index]
                calls[backend] = calls.get(backend, 0) + 1
    outside = sorted({op.name for op in plan.operators if any(o in op.name for o in WORKLOAD_OPS)})
    folder.mkdir(parents=True, exist_ok=True)
    tmp = pte.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(program.buffer)
    tmp.replace(pte)
    lower_s = time.perf_counter() - t0
    del program
    sidecar.write_text(
        json.dumps(
            {
                "delegates": delegates,
                "ops_outside": outside,
                "lower_s": lower_s,
                "delegate_calls": calls,
            }
        )
    )
    return Lowered(pte, delegates, outside, lower_s, False, calls)


def _inputs_tag(data: SettingData) -> str:
    text = _versions()
    if data.setting.kind == "zoo":
        from bench import zoo

        text += f"|zoo {zoo.sources_hash()}"
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _write_npz(path: Path, arrays) -> Path:
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **{str(i): np.asarray(a) for i, a in enumerate(arrays)})
        tmp.replace(path)
    return path


def inputs_npz(data: SettingData, seed: int, cache_dir: Path) -> Path:
    """The setting's inputs as "0", "1", ... (pte_runner's format), written once."""
    path = cache_dir / "inputs" / f"{data.setting.key(seed)}-{_inputs_tag(data)}.npz"
    return _write_npz(path, data.inputs)


def steps_npz(data: SettingData, seed: int, cache_dir: Path) -> list[Path]:
    """A streaming zoo setting's calls, one file each (pte_runner's
    ``-steps_npz_paths``): the prefill, then the decode steps."""
    folder = cache_dir / "inputs" / f"{data.setting.key(seed)}-{_inputs_tag(data)}"
    return [
        _write_npz(folder / f"call{k}.npz", [t.contiguous().numpy() for t in call])
        for k, call in enumerate(data.zoo.calls)
    ]


def onnx_path(data: SettingData, seed: int, cache_dir: Path) -> Path:
    """Where the setting's ONNX export is cached (bench/zoo.py's onnx_call)."""
    key = f"onnx|{_versions()}|seed {seed}|{_inputs_tag(data)}"
    if data.setting.kind == "blocks":
        key += f"|export side {_export_side_hash()}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir / "onnx" / data.setting.key(seed) / f"model-{digest}.onnx"
