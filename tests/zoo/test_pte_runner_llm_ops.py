"""pte_runner runs programs that call ExecuTorch's LLM custom ops
(``llama::update_cache.out``, ``llama::custom_sdpa.out``), as ExecuTorch's LLM
recipes produce them: it loads the executorch wheel's
``libcustom_ops_aot_lib.so`` when the method misses an operator
(``-llm_ops auto``, the default), before the program (``on``) or never
(``off``). The whole LFM2 recipe runs in test_lfm2_recipe.py; this is the
same mechanism on a program of two ops, fast."""

import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import pte_runner_path, save
from executorch.exir import to_edge
from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (torch.ops.llama.*)
from torch.export import export

HEADS, DIM, SEQ, CACHE = 2, 8, 5, 16
pytestmark = pytest.mark.filterwarnings(
    "ignore:_check_is_size:FutureWarning", "ignore:Mutation on a buffer:UserWarning"
)


class CachedAttention(torch.nn.Module):
    """K and V written into caches at position 0, then causal attention over
    the caches: the two custom ops a KV-cached LLM recipe program calls."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, CACHE, HEADS, DIM))
        self.register_buffer("v_cache", torch.zeros(1, CACHE, HEADS, DIM))

    def forward(self, q, k, v):
        torch.ops.llama.update_cache(k, self.k_cache, 0)
        torch.ops.llama.update_cache(v, self.v_cache, 0)
        return torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, 0, None, 0.0, True)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(1, SEQ, HEADS, DIM, generator=gen) for _ in range(3))
    et = to_edge(export(CachedAttention(), inputs)).to_executorch()
    ops = {op.name for op in et.executorch_program.execution_plan[0].operators}
    assert {"llama::update_cache", "llama::custom_sdpa"} <= ops, ops
    pte = save(et, tmp_path_factory.mktemp("llm_ops"))
    q, k, v = (t.transpose(1, 2) for t in inputs)  # [B, H, S, D]
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    return pte, inputs, want


def run(pte, inputs, tmp_path, *flags):
    in_npz, out_npz = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(in_npz, **{str(i): t.numpy() for i, t in enumerate(inputs)})
    return subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte), "-inputs_npz_path", str(in_npz),
         "-output_npz_path", str(out_npz), *flags],
        capture_output=True, text=True, timeout=120,
    ), out_npz  # fmt: skip


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_pte_runner_loads_the_llm_custom_ops_and_matches_sdpa(program, mode, tmp_path):
    pte, inputs, want = program
    flags = () if mode == "auto" else ("-llm_ops", "on")
    result, out_npz = run(pte, inputs, tmp_path, *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    if mode == "auto":
        assert "loaded ExecuTorch's LLM custom ops" in result.stderr, result.stderr[-2000:]
    with np.load(out_npz) as out:
        got = torch.from_numpy(out["0"])
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-5


def test_pte_runner_without_the_llm_custom_ops_names_the_missing_operator(program, tmp_path):
    pte, inputs, _ = program
    result, _ = run(pte, inputs, tmp_path, "-llm_ops", "off")
    assert result.returncode != 0
    assert "llama::" in result.stderr and "OperatorMissing" in result.stderr, result.stderr


def test_pte_runner_says_why_when_the_library_cannot_be_loaded(program, tmp_path, monkeypatch):
    pte, inputs, _ = program
    monkeypatch.setenv("RUSTCONV_LLM_OPS_LIB", str(tmp_path / "missing.so"))
    result, _ = run(pte, inputs, tmp_path)
    assert result.returncode != 0
    assert "missing.so" in result.stderr and "does not exist" in result.stderr, result.stderr
