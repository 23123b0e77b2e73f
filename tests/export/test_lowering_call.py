"""ops_to_not_decompose reads the partitioner list of its to_edge_transform_and_lower
call (rustconv/export/lowering_call.py): pinned here to executorch 1.5.1's frames.

Alone, RustConv keeps conv1d (and softplus) whole where it takes them; with
another partitioner in the list its decomposition pass is the identity, so
the others' passes alone shape the program (rule one of issue 16; the whole
check on real models is tests/test_rule_one.py).
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from rustconv.export.lowering_call import (
    EXECUTORCH_VERSION,
    UnknownCaller,
    current_call,
    installed_version,
)
from rustconv_test_helpers import export, lowered_modules
from torch import nn


class Recording(RustConvPartitioner):
    """Records every (phase, other partitioners, answer) of ops_to_not_decompose."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def ops_to_not_decompose(self, ep):
        call = current_call(self)
        answer = super().ops_to_not_decompose(ep)
        others = [type(p).__name__ for p in call.partitioners if p is not self]
        self.calls.append((call.phase, others, answer))
        return answer


class ConvLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1, groups=8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(torch.relu(self.conv(x)).transpose(1, 2))


def test_written_against_this_executorch():
    assert installed_version() == EXECUTORCH_VERSION


def test_alone_keeps_conv1d_where_taken():
    partitioner = Recording()
    ep = export(ConvLinear(), (torch.randn(1, 8, 16),))
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    phases = {phase for phase, _, _ in partitioner.calls}
    assert phases == {"decomposition", "check"}
    for _, others, (ops, keep) in partitioner.calls:
        assert others == []
        assert torch.ops.aten.conv1d.default in ops and keep is not None
    (lm,) = lowered_modules(edge)
    targets = [str(n.target) for n in lm.original_module.graph.nodes]
    assert any("conv1d" in t for t in targets), targets


@pytest.mark.parametrize("first", [True, False], ids=["rustconv_first", "rustconv_last"])
def test_with_others_our_pass_keeps_everything_and_checks_nothing(first):
    partitioner = Recording()
    ep = export(ConvLinear(), (torch.randn(1, 8, 16),))
    partitioners = [partitioner, XnnpackPartitioner()]
    if not first:
        partitioners.reverse()
    edge = to_edge_transform_and_lower(ep, partitioner=partitioners)
    decomposition = [a for phase, _, a in partitioner.calls if phase == "decomposition"]
    check = [a for phase, _, a in partitioner.calls if phase == "check"]
    assert decomposition and check
    assert all(o == ["XnnpackPartitioner"] for _, o, _ in partitioner.calls)
    for ops, keep in decomposition:
        # Every op the default table would decompose, and no filter: the skip path.
        assert keep is None
        assert torch.ops.aten.linear.default in ops
    for ops, keep in check:
        assert ops == [] and not any(keep(n) for n in edge.exported_program().graph.nodes)
    # XNNPACK still sees (and takes) the linear whole.
    xnnpack = lowered_modules(edge, "XnnpackBackend")
    assert any("linear" in str(n.target) for lm in xnnpack for n in lm.original_module.graph.nodes)


def test_called_from_elsewhere_is_a_loud_error():
    ep = export(ConvLinear(), (torch.randn(1, 8, 16),))
    with pytest.raises(UnknownCaller, match="to_edge_transform_and_lower"):
        RustConvPartitioner().ops_to_not_decompose(ep)


def test_default_table_ops_follow_newly_registered_composite_ops():
    """A composite op registered between two lowerings (a custom-op library
    loaded) is in the next answer, and the answer is the table's."""
    from executorch.exir.program._program import _default_decomposition_table
    from rustconv.export.partitioner import _default_table_ops

    assert _default_table_ops() == frozenset(_default_decomposition_table().keys())
    lib = torch.library.Library("rustconv_test_table", "DEF")  # noqa: TOR901
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
    op = torch.ops.rustconv_test_table.twice.default
    assert op in _default_decomposition_table()
    assert op in _default_table_ops()


def test_default_table_ops_follow_a_composite_kernel_registered_after_its_op():
    """Failed when the answer was kept per count of operators: a composite
    kernel registered for an op defined earlier adds no operator, and the
    stale answer left the op out (our pass would then decompose it under the
    other partitioners). Seen in the test run: ExecuTorch's quant fusion
    patterns (built by the LLM recipes' export) register composite kernels
    for ``quantized_decomposed.add``, defined since ``exir`` was imported."""
    from rustconv.export.partitioner import _default_table_ops

    lib = torch.library.Library("rustconv_test_late", "DEF")  # noqa: TOR901
    lib.define("thrice(Tensor x) -> Tensor")
    op = torch.ops.rustconv_test_late.thrice.default
    assert op not in _default_table_ops()
    lib.impl("thrice", lambda x: x + x + x, "CompositeImplicitAutograd")
    assert op in _default_table_ops()


def test_default_table_ops_follow_a_library_dropped_and_another_loaded():
    """One library unloaded and another of as many operators loaded: the
    count is the same, the answer is not."""
    from rustconv.export.partitioner import _default_table_ops

    def composite(namespace: str):
        lib = torch.library.Library(namespace, "DEF")  # noqa: TOR901
        lib.define("f(Tensor x) -> Tensor")
        lib.impl("f", lambda x: x * 2, "CompositeImplicitAutograd")
        return lib

    first = composite("rustconv_test_first")
    assert any(op.name() == "rustconv_test_first::f" for op in _default_table_ops())
    first._destroy()
    second = composite("rustconv_test_second")
    names = {op.name() for op in _default_table_ops()}
    assert "rustconv_test_second::f" in names
    assert "rustconv_test_first::f" not in names
    second._destroy()
