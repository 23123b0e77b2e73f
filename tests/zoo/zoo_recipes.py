"""ExecuTorch's LFM2 recipes as the executorch wheel ships them
(``examples/models/lfm2/config/lfm2_xnnpack_{fp32,q8da4w}.yaml`` through the
llama infrastructure: ``export_llama_lib._export_llama`` and
``LLMEdgeManager``), with random weights and, optionally, RustConv added
before the recipe's partitioners.

Nothing of the recipe is re-implemented: ``_export_llama`` runs as shipped.
Two things are patched around it, for the duration of one export:

* ``LLMEdgeManager.to_edge_transform_and_lower`` gets ``RustConvPartitioner()``
  prepended to the partitioners the recipe passes (XNNPACK's dynamically
  quantized one, then XNNPACK's), when ``with_rustconv``;
* ``_prepare_for_llama_export`` is wrapped to keep the eager model it
  returns (quantized by the recipe's source transforms, KV cache and custom
  SDPA in place), the reference; its caches are zero after export, and
  ``eager_logits`` runs a copy.

Random weights come in as a checkpoint file (the model's parameter names,
drawn from a seeded generator), because without one the recipe builds the
model on the meta device and ``to_empty`` leaves every buffer (conv states,
rotary tables, masks) uninitialised. With a checkpoint it takes the path a
downloaded LFM2 takes.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from zoo_models import delegate_calls

#: examples/models/lfm2/config/lfm2_350m_config.json upstream (not in the
#: wheel): LFM2-350M in the llama infrastructure's ModelArgs.
LFM2_350M_PARAMS = {
    "dim": 1024,
    "ffn_dim_multiplier": 1,
    "hidden_dim": 4608,
    "n_heads": 16,
    "n_kv_heads": 8,
    "n_layers": 16,
    "norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "use_scaled_rope": False,
    "vocab_size": 65536,
    "use_hf_rope": True,
    "use_qk_norm": True,
    "qk_norm_before_rope": True,
    "layer_types": [
        "conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
        "full_attention", "conv", "full_attention", "conv", "full_attention", "conv",
        "full_attention", "conv",
    ],
}  # fmt: skip
#: The default test's model: the same architecture, narrow, three layers.
SMALL_PARAMS = {
    **LFM2_350M_PARAMS,
    "dim": 128,
    "hidden_dim": 256,
    "n_heads": 4,
    "n_kv_heads": 2,
    "n_layers": 3,
    "vocab_size": 256,
    "layer_types": ["conv", "full_attention", "conv"],
}
RECIPES = ("lfm2_xnnpack_fp32", "lfm2_xnnpack_q8da4w")


@dataclass
class RecipeProgram:
    program: object  # the ExecutorchProgramManager
    pte: Path
    eager: torch.nn.Module  # the recipe's eager model (transformed), fresh caches
    rustconv_calls: int
    xnnpack_calls: int
    ops: list[str]
    conv_layers: int


def recipe_config(recipe: str, params: dict, work: Path, name: str):
    """The recipe's LlmConfig (its yaml over LlmConfig's defaults) for a
    random-weight model of these params."""
    from executorch.examples.models.llama import export_llama_lib
    from executorch.examples.models.llama.model import Llama2Model
    from executorch.extension.llm.export.config.llm_config import LlmConfig
    from omegaconf import OmegaConf

    configs = Path(export_llama_lib.__file__).parents[1] / "lfm2" / "config"
    params_path = work / f"{name}-params.json"
    params_path.write_text(json.dumps(params))
    cfg = OmegaConf.merge(
        OmegaConf.structured(LlmConfig), OmegaConf.load(configs / f"{recipe}.yaml")
    )
    cfg.base.model_class = "lfm2_350m"
    cfg.base.params = str(params_path)
    cfg.export.max_seq_length = 128
    cfg.export.max_context_length = 256
    cfg.export.output_dir = str(work)
    cfg.export.output_name = str(work / f"{name}.pte")
    # The parameter names and shapes, from the model built without weights.
    # Named for the params only: llama's model.py treats a checkpoint whose
    # path says "8da4w" or "int8" as pre-quantized.
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    checkpoint = work / f"random-weights-{digest}.pth"
    if any(tag in str(checkpoint) for tag in ("8da4w", "int8")):
        raise ValueError(
            f"{checkpoint}: llama's model.py would take a checkpoint whose path says 8da4w or "
            "int8 for a pre-quantized one; export into another directory"
        )
    if not checkpoint.is_file():
        shapes = {
            n: p.shape for n, p in Llama2Model(OmegaConf.to_object(cfg)).model_.named_parameters()
        }
        torch.save(random_weights(shapes, seed=0), checkpoint)
    cfg.base.checkpoint = str(checkpoint)
    return OmegaConf.to_object(cfg)


def random_weights(shapes: dict, seed: int) -> dict[str, torch.Tensor]:
    """O(1) activations: matrices and conv filters ~ N(0, 1/fan_in), norm
    weights 1 + N(0, 0.1^2), embeddings N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in sorted(shapes.items()):
        if len(shape) == 1:
            weights[name] = 1 + 0.1 * torch.randn(shape, generator=gen)
        elif "embeddings" in name:
            weights[name] = torch.randn(shape, generator=gen)
        else:
            weights[name] = torch.randn(shape, generator=gen) / shape[1:].numel() ** 0.5
    return weights


@contextlib.contextmanager
def _patched(with_rustconv: bool, captured: dict):
    from executorch.examples.models.llama import export_llama_lib
    from executorch.extension.llm.export.builder import LLMEdgeManager
    from rustconv import RustConvPartitioner

    prepare = export_llama_lib._prepare_for_llama_export
    lower = LLMEdgeManager.to_edge_transform_and_lower

    def prepare_and_keep(llm_config):
        manager = prepare(llm_config)
        # A reference: export leaves the model as it was.
        captured["eager"] = manager.model
        return manager

    def lower_with_rustconv(self, partitioners, *args, **kwargs):
        captured["partitioners"] = [type(p).__name__ for p in partitioners]
        if with_rustconv:
            partitioners = [RustConvPartitioner(), *partitioners]
        return lower(self, partitioners, *args, **kwargs)

    export_llama_lib._prepare_for_llama_export = prepare_and_keep
    LLMEdgeManager.to_edge_transform_and_lower = lower_with_rustconv
    try:
        yield
    finally:
        export_llama_lib._prepare_for_llama_export = prepare
        LLMEdgeManager.to_edge_transform_and_lower = lower


def export_recipe(
    recipe: str, with_rustconv: bool, work: Path, full: bool = False
) -> RecipeProgram:
    """Runs the recipe's own export (``_export_llama``) and returns its program."""
    from executorch.examples.models.llama import export_llama_lib

    params = LFM2_350M_PARAMS if full else SMALL_PARAMS
    name = f"{recipe}-{'rustconv' if with_rustconv else 'shipped'}-{'full' if full else 'small'}"
    work.mkdir(parents=True, exist_ok=True)
    llm_config = recipe_config(recipe, params, work, name)
    captured: dict = {}
    with _patched(with_rustconv, captured):
        builder = export_llama_lib._export_llama(llm_config)
    program = builder.export_program
    plan = program.executorch_program.execution_plan[0]
    return RecipeProgram(
        program,
        Path(builder.get_saved_pte_filename()),
        captured["eager"],
        delegate_calls(program, "RustConvBackend"),
        delegate_calls(program, "XnnpackBackend"),
        sorted({op.name for op in plan.operators}),
        params["layer_types"].count("conv"),
    )


def recipe_for_lowering(recipe: str, work: Path, full: bool = False):
    """The recipe's ``LLMEdgeManager`` up to lowering: the steps ``_export_llama``
    takes before ``to_edge_transform_and_lower`` (model from the random
    checkpoint, source transforms such as 8da4w, export, the recipe's
    quantizers), for lowering with any partitioner list
    (``rustconv.devtools.testing.check_others_unchanged``). Same weights each call."""
    from executorch.examples.models.llama import export_llama_lib

    params = LFM2_350M_PARAMS if full else SMALL_PARAMS
    work.mkdir(parents=True, exist_ok=True)
    name = f"{recipe}-lowering-{'full' if full else 'small'}"
    llm_config = recipe_config(recipe, params, work, name)
    torch.manual_seed(0)
    _, quantizers, _ = export_llama_lib.get_quantizer_and_quant_params(llm_config)
    builder = export_llama_lib._prepare_for_llama_export(llm_config).export()
    builder.run_canonical_optimizations()
    return builder.pt2e_quantize(quantizers)


def recipe_partitioners() -> list:
    """The partitioners the recipe lowers with (``_to_edge_and_lower_llama_xnnpack``):
    XNNPACK's dynamically quantized one, then XNNPACK's."""
    from executorch.extension.llm.export.partitioner_lib import get_xnnpack_partitioner

    return [
        get_xnnpack_partitioner(dynamic_quant_only_partitioner=True),
        get_xnnpack_partitioner(dynamic_quant_only_partitioner=False),
    ]


def token_calls(vocab: int, prompt: int, decode: int, seed: int = 1) -> list[tuple]:
    """A prefill of ``prompt`` tokens at position 0, then ``decode`` one-token
    calls: ``(tokens [1, n], input_pos [1])`` as the recipe's program takes them."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (1, prompt + decode), generator=gen)
    calls = [(tokens[:, :prompt], torch.tensor([0]))]
    calls += [
        (tokens[:, prompt + k : prompt + k + 1], torch.tensor([prompt + k])) for k in range(decode)
    ]
    return calls


def eager_logits(model: torch.nn.Module, calls: list[tuple]) -> list[torch.Tensor]:
    """The recipe's eager model on the calls, in order, on a copy (its KV
    caches and conv states carried from call to call)."""
    model = copy.deepcopy(model)
    out = []
    with torch.no_grad():
        for tokens, pos in calls:
            logits = model(tokens, {"input_pos": pos})
            out.append(logits[0] if isinstance(logits, tuple) else logits)
    return out


def have_recipe_dependencies() -> str | None:
    """None, or why the recipe cannot be exported here."""
    try:
        import executorch.examples.models.lfm2  # noqa: F401  (needs safetensors)
        from executorch.examples.models.llama import export_llama_lib  # noqa: F401
        from executorch.extension.llm.export.builder import LLMEdgeManager  # noqa: F401
    except ImportError as e:
        return f"ExecuTorch's LLM example infrastructure does not import: {e}"
    return None


__all__ = [
    "RECIPES",
    "LFM2_350M_PARAMS",
    "SMALL_PARAMS",
    "export_recipe",
    "recipe_for_lowering",
    "recipe_partitioners",
    "token_calls",
    "eager_logits",
    "have_recipe_dependencies",
]
