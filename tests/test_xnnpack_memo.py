"""The test run's memo of XNNPACK's preprocess (xnnpack_memo.py) hands out
a blob only for a partition equal in what preprocess reads, and that blob is
the one XNNPACK makes."""

import torch
import xnnpack_memo
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from torch.export import export


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def lowered(module) -> bytes:
    ep = export(module, (torch.randn(4, 16),))
    return (
        to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    )


def test_same_partition_hits_and_gets_xnnpacks_own_blob():
    torch.manual_seed(0)
    block = Block().eval()
    memo, uninstall = xnnpack_memo.install()  # a memo of its own, over the session's
    try:
        first = lowered(block)
        assert (memo.hits, memo.misses) == (0, 1)
        again = lowered(block)
        assert (memo.hits, memo.misses) == (1, 1)
    finally:
        uninstall()
    assert again == first
    # Without any memo, XNNPACK makes the same program.
    original = xnnpack_memo.original_preprocess()
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    saved = XnnpackBackend.__dict__["preprocess"]
    XnnpackBackend.preprocess = staticmethod(original)
    try:
        assert lowered(block) == first
    finally:
        XnnpackBackend.preprocess = saved


def test_a_changed_weight_or_shape_misses():
    torch.manual_seed(0)
    block = Block().eval()
    memo, uninstall = xnnpack_memo.install()
    try:
        lowered(block)
        with torch.no_grad():
            block.b.weight[0, 0] += 1.0
        lowered(block)
        assert (memo.hits, memo.misses) == (0, 2)
        ep = export(block, (torch.randn(5, 16),))
        to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        assert (memo.hits, memo.misses) == (0, 3)
    finally:
        uninstall()
