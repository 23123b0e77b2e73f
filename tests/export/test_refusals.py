"""What RustConv leaves out, and the reasons explain() gives: never an error later."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge
from rustconv import RustConvPartitioner
from rustconv.export.partition_proposal import ISLAND_REASON
from rustconv_test_helpers import export, lower, lowered_modules, run_lowered
from torch import nn
from torch.export import Dim


class ConvThen(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.conv(x))


def explain(model, *inputs, dynamic_shapes=None) -> dict[str, str]:
    edge = to_edge(export(model.eval(), inputs, dynamic_shapes))
    return RustConvPartitioner().explain(edge.exported_program())


def reason_for(reasons: dict[str, str], needle: str) -> str:
    """The reason of the first node named like ``needle`` (graph order)."""
    names = [n for n in reasons if needle in n]
    assert names, f"no refused node named like {needle!r}: {reasons}"
    return reasons[names[0]]


# (model fn, the refused node's name fragment, words its reason contains)
REFUSED = {
    "reshape_merging_dims": (lambda y: y.reshape(1, 32) * 2, "view_copy", "more than removing"),
    "rank_5_broadcast": (
        lambda y: y.view(1, 1, 1, 4, 8) * torch.ones(2, 1, 1, 1, 1),
        "mul",
        "RustConv handles up to 4-D",
    ),
    "div_floor": (lambda y: torch.div(y, 3.0, rounding_mode="floor"), "div", "rounding_mode"),
    "fp64": (lambda y: y.double() * 2, "mul", "float64"),
    "mask_read_outside": (lambda y: torch.logical_not(y > 0), "gt", "bool result"),
    "cumsum": (lambda y: torch.cumsum(y, -1), "cumsum", "not a RustConv op"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_ops_are_left_out_with_a_reason(name):
    fn, needle, words = REFUSED[name]
    model = ConvThen(fn)
    x = torch.randn(1, 4, 8)
    reasons = explain(model, x)
    reason = reason_for(reasons, needle)
    assert words in reason, reason
    # Lowering works and the conv is still delegated; the refused op runs outside.
    edge = lower(model.eval(), (x,), "to_edge")
    (lm,) = lowered_modules(edge)
    taken = {n.name for n in lm.original_module.graph.nodes if n.op == "call_function"}
    assert not any(needle in t for t in taken)
    assert any("convolution" in t for t in taken)
    (got,), _ = run_lowered(edge, [x])
    torch.testing.assert_close(got.to(model(x).dtype), model(x), atol=1e-5, rtol=1e-5)


def test_softplus_with_other_beta_is_refused_in_one_piece():
    """softplus(beta=2) decomposes in to_edge (and is taken as its pieces); kept
    whole, it is refused with the reason."""
    from rustconv.export.ops_lowering import GraphContext
    from rustconv.export.ops_lowering.unary import UnaryLowering

    ep = export(ConvThen(lambda y: F.softplus(y, beta=2.0)).eval(), (torch.randn(1, 4, 8),))
    (node,) = [n for n in ep.graph.nodes if "softplus" in n.name]
    reason = UnaryLowering().unsupported_reason(node, GraphContext(ep))
    assert "beta=2.0" in reason and "beta=1, threshold=20" in reason


def test_dynamic_slice_that_cannot_be_expressed_is_left_out():
    class Half(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            return self.conv(x)[..., : x.shape[-1] // 2] * 2

    half = Dim("half", min=2, max=32)
    reasons = explain(Half(), torch.randn(1, 4, 16), dynamic_shapes=({2: 2 * half},))
    assert "neither a constant nor the dimension's length" in reason_for(reasons, "slice")


def test_elementwise_island_is_not_delegated_and_logged(caplog):
    class Island(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x, z):
            return self.conv(x), torch.relu(z) * 2

    model = Island().eval()
    inputs = (torch.randn(1, 4, 8), torch.randn(3, 5))
    reasons = explain(model, *inputs)
    assert reason_for(reasons, "relu") == ISLAND_REASON
    assert reason_for(reasons, "mul") == ISLAND_REASON
    with caplog.at_level(logging.INFO, logger="rustconv.export.partitioner"):
        edge = lower(model, inputs, "to_edge")
    (lm,) = lowered_modules(edge)
    assert [n.name for n in lm.original_module.graph.nodes if n.op == "call_function"] == [
        "aten_convolution_default"
    ]
    assert "does not take aten_relu_default: " + ISLAND_REASON in caplog.text


def test_explain_lists_only_nodes_not_taken():
    model = ConvThen(lambda y: torch.cumsum(torch.relu(y), -1))
    reasons = explain(model, torch.randn(1, 4, 8))
    assert list(reasons) == ["aten_cumsum_default"]


def test_weight_computed_from_an_input_stays_outside():
    """A weight computed at run time (here scaled by an input) is a delegate
    input: its producer is not taken. (A weight computed from constants alone
    is evaluated at export instead; see test_constant_folding.py.)"""

    class ScaledWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4, 3))

        def forward(self, x, s):
            return torch.relu(F.conv1d(x, self.w * s, padding=1))

    model = ScaledWeight().eval()
    x, s = torch.randn(1, 4, 8), torch.tensor([2.0])  # rank 1: a 0-d operand is refused anyway
    reasons = explain(model, x, s)
    assert "conv weight or bias" in reason_for(reasons, "mul")
    edge = lower(model, (x, s), "to_edge")
    (lm,) = lowered_modules(edge)
    (got,), _ = run_lowered(edge, [x, s])
    torch.testing.assert_close(got, model(x, s), atol=1e-5, rtol=1e-5)


def test_bool_condition_from_an_input_is_refused():
    class MaskIn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x, m):
            return torch.where(m, self.conv(x), 0.0)

    reasons = explain(MaskIn(), torch.randn(1, 4, 8), torch.rand(1, 4, 8) > 0.5)
    assert "not a comparison RustConv computes" in reason_for(reasons, "where")


def test_zero_dim_input_is_refused():
    """A 0-d graph input read by an elementwise op: the runtime's values have
    rank 1..4 (it refused such a blob at init, after the partitioner had taken
    the op; found by tests/difftest). A 0-d constant still folds as a scalar."""

    class ScaleBy(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, padding=1)
            self.gain = nn.Parameter(torch.tensor(0.5))

        def forward(self, x, s):
            return self.conv(x) * s * self.gain

    model = ScaleBy().eval()
    x, s = torch.randn(1, 4, 8), torch.tensor(2.0)
    reasons = explain(model, x, s)
    assert "0-d tensor" in reason_for(reasons, "mul"), reasons
    edge = lower(model, (x, s), "to_edge")
    (lm,) = lowered_modules(edge)
    taken = [n for n in lm.original_module.graph.nodes if n.op == "placeholder"]
    assert all(n.meta["val"].dim() > 0 for n in taken if "val" in n.meta)
    (got,), _ = run_lowered(edge, [x, s])
    torch.testing.assert_close(got, model(x, s), atol=1e-5, rtol=1e-5)
