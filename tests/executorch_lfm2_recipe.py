"""ExecuTorch's own LFM2 recipe, as ``examples/models/llama`` builds it, on a small
LFM2 with random weights (no download): the ``lfm2_xnnpack_fp32`` and
``lfm2_xnnpack_q8da4w`` configs shipped in the executorch wheel
(``examples/models/lfm2/config``: KV cache, custom SDPA, torchao 8da4w linears
with group size 128), lowered through ``LLMEdgeManager`` with the recipe's
partitioners (XNNPACK's dynamic-quant one, then XNNPACK), to which a test may
add RustConv.

The architecture is LFM2-350M's (short-conv and attention layers, QK norm,
HF RoPE) at a small width: 128 keeps every linear quantized (the recipe only
quantizes linears whose input width is a multiple of the group size).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: LFM2-350M's params.json, at a small width and depth.
PARAMS = {
    "dim": 128,
    "ffn_dim_multiplier": 1.0,
    "hidden_dim": 256,
    "n_heads": 4,
    "n_kv_heads": 2,
    "norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "use_scaled_rope": False,
    "vocab_size": 256,
    "use_hf_rope": True,
    "use_qk_norm": True,
    "qk_norm_before_rope": True,
    "n_layers": 3,
    "layer_types": ["conv", "full_attention", "conv"],
}


def llm_config(recipe: str, workdir: Path, params: dict | None = None, checkpoint=None):
    """The recipe's LlmConfig (``recipe``: "fp32" or "q8da4w") for our params."""
    import executorch.examples.models.llama.export_llama_lib as lib
    from executorch.extension.llm.export.config.llm_config import LlmConfig
    from omegaconf import OmegaConf

    path = workdir / "params.json"
    path.write_text(json.dumps(params or PARAMS))
    yaml = Path(lib.__file__).parent.parent / "lfm2" / "config" / f"lfm2_xnnpack_{recipe}.yaml"
    config = OmegaConf.merge(OmegaConf.structured(LlmConfig), OmegaConf.load(yaml))
    config.base.model_class = "lfm2_350m"
    config.base.params = str(path)
    config.export.max_seq_length = 16
    config.export.max_context_length = 32
    config.export.output_dir = str(workdir)
    if checkpoint is not None:
        config.base.checkpoint = str(checkpoint)
    return OmegaConf.to_object(config)


def random_checkpoint(workdir: Path, seed: int = 0, params: dict | None = None) -> Path:
    """Random weights in the example's own checkpoint format (its state dict).

    Without a checkpoint the example builds the model on the meta device and
    materialises it with ``to_empty``: the norms' weights are then whatever
    memory held (logits of inf).
    """
    import executorch.examples.models.llama.export_llama_lib as lib

    path = workdir / "weights.pth"
    if path.exists():
        return path
    model = lib._load_llama_model(llm_config("fp32", workdir, params)).model
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if param.dim() == 1:  # norm weights
            weights[name] = 1.0 + 0.1 * noise
        elif "tok_embeddings" in name:
            weights[name] = noise
        else:
            weights[name] = noise / param.shape[-1] ** 0.5
    torch.save(weights, path)
    return path


def exported(recipe: str, workdir: Path, seed: int = 0, params: dict | None = None):
    """The recipe's LLMEdgeManager up to lowering: model built from a random
    checkpoint, source-transformed (8da4w for q8da4w), exported, quantizers
    applied. Same seed, same weights."""
    import executorch.examples.models.llama.export_llama_lib as lib

    config = llm_config(recipe, workdir, params, random_checkpoint(workdir, seed, params))
    torch.manual_seed(seed)
    _, quantizers, _ = lib.get_quantizer_and_quant_params(config)
    builder = lib._prepare_for_llama_export(config).export()
    builder.run_canonical_optimizations()
    return builder.pt2e_quantize(quantizers)


def recipe_partitioners() -> list:
    """The partitioners ``_to_edge_and_lower_llama_xnnpack`` uses with extended ops."""
    from executorch.extension.llm.export.partitioner_lib import get_xnnpack_partitioner

    return [
        get_xnnpack_partitioner(dynamic_quant_only_partitioner=True),
        get_xnnpack_partitioner(dynamic_quant_only_partitioner=False),
    ]


def flat_inputs(builder, tokens: torch.Tensor, start: int = 0) -> list[torch.Tensor]:
    """The program's inputs (tokens, input_pos) for a prefill of ``tokens`` at ``start``."""
    del builder
    return [tokens, torch.tensor([start], dtype=torch.long)]
