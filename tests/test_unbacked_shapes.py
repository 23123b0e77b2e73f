"""Sizes export learns only at run time (unbacked ``u0``: a padding read from
a tensor with ``.item()``, as transformers' Mimi decoder does) have no finite
bounds. ``explain()`` used to crash on them (``'Infinity' object has no
attribute '_mpf_'``: sympy's ``int()`` of torch's ``-int_oo`` lower bound,
asked for by a slice's end), and a conv on such a size was taken and failed
in ``preprocess`` (``DynamicShapeError``). Now every node with such a size is
refused with a reason and left to the next partitioner.
"""

import torch
import torch.nn.functional as F
from executorch.exir import to_edge
from rustconv import RustConvPartitioner
from torch.export import export


class PadByValue(torch.nn.Module):
    """A causal pad whose size is a tensor (a buffer, as MimiConv1d's
    ``padding_total``), then a conv and a slice."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3)
        self.register_buffer("pad", torch.tensor(2), persistent=False)

    def forward(self, x):
        y = self.conv(F.pad(x, (self.pad, 0)))
        return torch.relu(y[..., :-1])


UNBOUNDED = "no finite upper bound"


def test_explain_refuses_nodes_of_unbacked_size():
    model = PadByValue().eval()
    inputs = (torch.randn(1, 4, 12),)
    ep = export(model, inputs)
    reasons = RustConvPartitioner().explain(ep)
    refused = {name for name, reason in reasons.items() if UNBOUNDED in reason}
    assert {"conv1d", "slice_1", "relu"} <= refused, reasons
    # ... and partitioning takes none of them (preprocess used to raise
    # DynamicShapeError). ExecuTorch itself cannot plan the unbacked sizes'
    # memory (to_executorch raises in dim_order_from_stride), so it stops here.
    edge = to_edge(export(model, inputs)).to_backend(RustConvPartitioner())
    gm = edge.exported_program().graph_module
    assert not [
        n for n in gm.graph.nodes if n.target is torch.ops.higher_order.executorch_call_delegate
    ]


def test_explain_on_the_mimi_decoder_does_not_crash():
    """The report's reproduction: transformers' MimiModel(...).decoder exported
    as is; its paddings are tensors, so every length after the first pad is
    unbacked, and every conv on one is refused with the reason."""
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(0)
    config = MimiConfig(num_filters=8, hidden_size=32, upsample_groups=32)
    decoder = MimiModel(config).eval().decoder
    reasons = RustConvPartitioner().explain(export(decoder, (torch.randn(1, 32, 10),)))
    convs = {name: reason for name, reason in reasons.items() if name.startswith("conv1d")}
    assert convs and all(UNBOUNDED in reason for reason in convs.values()), convs
