"""ELU (``nn.ELU``, ``F.elu``, ``selu``, which reaches ``aten.elu`` with a
scale, and ``aten.elu`` with an input scale) runs in the fused kernels, as the
comparison, ``exp``, multiply-adds and select it is (ops_lowering/elu.py):
the SEANet convs of transformers' Mimi no longer split at every activation.
"""

import pytest
import torch
from conftest import ConvActConv, run_activation_model, zoo_example
from torch.export import export


class AtenElu(torch.nn.Module):
    """``aten.elu`` with all three numbers (no nn module sets input_scale:
    CELU decomposes to expm1)."""

    def __init__(self, **numbers):
        super().__init__()
        self.numbers = numbers

    def forward(self, x):
        return torch.ops.aten.elu(x, **self.numbers)


ACTIVATIONS = {
    "elu": lambda: torch.nn.ELU(),
    "elu_alpha": lambda: torch.nn.ELU(alpha=0.3),
    "selu": lambda: torch.nn.SELU(),  # aten.elu with scale and alpha
    "input_scale": lambda: AtenElu(alpha=0.7, scale=1.3, input_scale=0.5),
}


@pytest.mark.parametrize("flow", ["to_edge", "transform"])
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_elu_between_convs_is_one_call(act, flow, tmp_path):
    torch.manual_seed(0)
    model = ConvActConv(ACTIVATIONS[act]())
    x = torch.randn(2, 8, 30) * 3
    x[0, :, :4] = 60.0  # exp overflows to inf on the positive side: never selected
    x[1, :, :4] = -60.0
    calls, leftover = run_activation_model(model, (x,), flow, tmp_path)
    assert (calls, leftover) == (1, [])


def test_elu_scale_known_only_at_run_time_is_refused():
    from rustconv.export.ops_lowering.common import NotSupported
    from rustconv.export.ops_lowering.elu import elu_params

    ep = export(ConvActConv(torch.nn.ELU()).eval(), (torch.randn(1, 8, 10),))
    (node,) = [n for n in ep.graph.nodes if n.target is torch.ops.aten.elu.default]
    node.args = (node.args[0], node.args[0])  # alpha a tensor
    with pytest.raises(NotSupported, match="alpha"):
        elu_params(node)


def _mimi(part: str):
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(0)
    model = MimiModel(MimiConfig(num_filters=8, hidden_size=32, upsample_groups=32)).eval()
    return getattr(model, part)


@pytest.mark.parametrize("part,calls", [("encoder", 1), ("decoder", 1)])
def test_mimi_seanet_chains_through_its_elus(part, calls, tmp_path):
    """transformers' Mimi SEANet (MimiConfig(num_filters=8, hidden_size=32,
    upsample_groups=32)), through the zoo's wrappers of its upstream modules:
    the encoder was 14 calls, one per conv, and the decoder 10, while ELU
    stayed outside; now each is one call (the decoder's 4 ConvTranspose1d
    upsamplers too, since transposed convs are RustConv's), no ELU left outside.
    (tests/zoo checks the same through to_edge_transform_and_lower.)"""
    example = zoo_example(f"hf_mimi_{part}")
    got, leftover = run_activation_model(example.module, example.inputs, "to_edge", tmp_path)
    assert got == calls
    assert not [op for op in leftover if "elu" in op], leftover
