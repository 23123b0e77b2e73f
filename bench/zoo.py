"""The ``zoo`` workload: the model zoo of ``tests/zoo`` (upstream models from
transformers, torchaudio and ExecuTorch's examples, random weights), timed
whole, and ONNX Runtime as an alternative for it and for the blocks.

Models are ``tests/zoo/zoo_models.py``'s entries (those fast enough to lower
in a benchmark run) and ExecuTorch's LFM2 recipes (``tests/zoo/zoo_recipes.py``):

* ``et_lfm2_fp32``, ``et_lfm2_q8da4w``: the recipe's program (its own
  partitioners, as shipped: the ``xnnpack`` alternative; with
  ``RustConvPartitioner()`` first: ``ours``), one prompt of ``PROMPT`` tokens
  per call (prefill), and ``<name>:decode``: one token per call after a
  prefill, its KV cache and conv states carried (pte_runner
  ``-steps_npz_paths`` with ``-decode_steps``).

The full size (the models' real widths; ``size=full``, the default) or the
tests' small one (``size=small``, what bench/test_bench.py runs).

ONNX Runtime (``onnxruntime``): ``torch.onnx.export(model, inputs,
dynamo=True)``, an ``InferenceSession`` on the CPU execution provider with
``intra_op_num_threads`` = the run's thread count (and one inter-op thread,
sequential execution), timed in this process like eager. Not applicable to
the recipes (their KV cache and SDPA are ExecuTorch custom ops) or to models
whose state lives in mutated buffers (ONNX has no state across calls).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
ZOO_DIR = ROOT / "tests" / "zoo"
#: zoo name -> the recipe (its yaml in examples/models/lfm2/config).
RECIPES = {"et_lfm2_fp32": "lfm2_xnnpack_fp32", "et_lfm2_q8da4w": "lfm2_xnnpack_q8da4w"}
DECODE = ":decode"
#: Recipe prefill tokens. The recipe's export (LLMEdgeManager) bounds the
#: token dimension by max_seq_length - 1 (zoo_recipes: 128), so a prompt of
#: 128 is refused at set_input.
PROMPT = {"full": 127, "small": 16}
DECODE_STEPS = 8


@cache
def modules():
    """tests/zoo's modules (zoo_models, zoo_recipes), imported from there."""
    for path in (str(ZOO_DIR), str(ROOT / "tests")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import zoo_models
    import zoo_recipes

    return zoo_models, zoo_recipes


def names() -> list[str]:
    """Every zoo entry the benchmark runs, in order: the models (not those
    marked slow), then the recipes, prefill and decode."""
    zoo_models, _ = modules()
    models = [n for n, m in zoo_models.MODELS.items() if not m.slow]
    return models + [r + phase for r in RECIPES for phase in ("", DECODE)]


def is_recipe(name: str) -> bool:
    return name.split(":")[0] in RECIPES


def sources_hash() -> str:
    """The zoo's definitions: a changed model re-exports."""
    h = hashlib.sha256()
    for path in sorted(ZOO_DIR.glob("zoo_*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@dataclass
class ZooCase:
    """One zoo entry at one size: its eager module, its calls' inputs (the
    timed one last: a recipe's decode setting times the calls after the
    prefill), its export options, and whether its state is in buffers."""

    name: str
    full: bool
    module: torch.nn.Module
    calls: list[tuple]
    strict: bool = False
    edge_compile_config: dict | None = None
    rustconv_calls: int | None = None
    why: str = ""

    @property
    def decode(self) -> bool:
        return self.name.endswith(DECODE)

    @property
    def inputs(self) -> tuple:
        """The inputs of the call timed by -inputs_npz_path (the prefill)."""
        return self.calls[0]


@cache
def case(name: str, full: bool) -> ZooCase:
    zoo_models, zoo_recipes = modules()
    if is_recipe(name):
        params = zoo_recipes.LFM2_350M_PARAMS if full else zoo_recipes.SMALL_PARAMS
        prompt = PROMPT["full" if full else "small"]
        steps = DECODE_STEPS if name.endswith(DECODE) else 0
        calls = zoo_recipes.token_calls(params["vocab_size"], prompt, steps)
        return ZooCase(
            name, full, None, calls,
            rustconv_calls=params["layer_types"].count("conv"),
            why="one per short-conv layer",
        )  # fmt: skip
    example = zoo_models.MODELS[name].build(full)
    return ZooCase(
        name,
        full,
        example.module,
        [example.inputs],
        example.strict,
        example.edge_compile_config,
        example.rustconv_calls,
        example.why,
    )


def recipe_program(name: str, full: bool, with_rustconv: bool, work: str):
    """The recipe exported as shipped or with RustConv first (prefill and
    decode settings share it)."""
    return _recipe_program(RECIPES[name.split(":")[0]], full, with_rustconv, work)


@cache
def _recipe_program(recipe: str, full: bool, with_rustconv: bool, work: str):
    _, zoo_recipes = modules()
    return zoo_recipes.export_recipe(recipe, with_rustconv, Path(work), full=full)


def recipe_eager_model(name: str, full: bool, work: str) -> torch.nn.Module:
    return recipe_program(name, full, False, work).eager


def lower(alt: str, zc: ZooCase, work: Path, config):
    """The ExecutorchProgramManager of one alternative: ``ours``
    ``[RustConvPartitioner(), XnnpackPartitioner()]``, ``xnnpack`` alone,
    ``et_cpu`` no delegate; the recipes' through their own export."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower
    from rustconv import RustConvPartitioner
    from torch.export import export

    if is_recipe(zc.name):
        if alt not in ("ours", "xnnpack"):
            raise ValueError(f"no {alt} program for ExecuTorch's recipe")
        return recipe_program(zc.name, zc.full, alt == "ours", str(work)).program
    ep = export(zc.module, zc.inputs, strict=zc.strict)
    edge_config = EdgeCompileConfig(**(zc.edge_compile_config or {}))
    if alt == "et_cpu":
        return to_edge(ep, compile_config=edge_config).to_executorch(config)
    partitioners = [XnnpackPartitioner()]
    if alt == "ours":
        partitioners.insert(0, RustConvPartitioner())
    elif alt != "xnnpack":
        raise ValueError(f"no lowering for {alt}")
    lowered = to_edge_transform_and_lower(ep, partitioner=partitioners, compile_config=edge_config)
    return lowered.to_executorch(config)


def eager_call(zc: ZooCase, work: Path):
    """The eager model's timed call and the reference output. Recipes: the
    recipe's eager model (KV cache, custom SDPA; quantized for q8da4w), the
    calls before the timed one run first."""
    import copy

    if is_recipe(zc.name):
        model = copy.deepcopy(recipe_eager_model(zc.name, zc.full, str(work)))
        with torch.no_grad():
            for tokens, pos in zc.calls[:-1]:
                model(tokens, {"input_pos": pos})
        tokens, pos = zc.calls[-1]
        saved = {n: b.clone() for n, b in model.named_buffers()}

        def call():
            # Every timed call starts from the state after the calls before.
            with torch.no_grad():
                for n, b in model.named_buffers():
                    b.copy_(saved[n])
                out = model(tokens, {"input_pos": pos})
            return out[0] if isinstance(out, tuple) else out

        return call
    model, inputs = zc.module, zc.inputs

    def call():
        with torch.inference_mode():
            out = model(*inputs)
        return first_tensor(out)

    return call


def first_tensor(out) -> torch.Tensor:
    zoo_models, _ = modules()
    return zoo_models.flatten(out)[0]


def has_state_buffers_module(module: torch.nn.Module | None, inputs: tuple) -> bool:
    """Whether the module mutates a buffer (state carried across calls)."""
    if module is None:
        return True
    from torch.export import export

    ep = export(module, tuple(inputs), strict=False)
    return bool(ep.graph_signature.buffers_to_mutate)


def onnx_call(module: torch.nn.Module, inputs: tuple, threads: int, path: Path):
    """ONNX Runtime's call for the module: exported once to ``path`` (kept as
    a cache), run with ``threads`` intra-op threads. Returns the call, which
    gives output 0."""
    import onnxruntime as ort

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        with torch.no_grad():
            torch.onnx.export(module, inputs, str(tmp), dynamo=True, external_data=False)
        tmp.replace(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    arrays = [np.ascontiguousarray(t.numpy()) for t in inputs]
    feed = {i.name: a for i, a in zip(session.get_inputs(), arrays, strict=True)}
    return lambda: session.run(None, feed)[0]
