"""The reference interpreter (``rustconv.devtools.reference``) knows every op kind
the schema does.

The blob schema (``schema/rustconv.fbs``, generated into ``rustconv.fb``) is the
one list of what a blob can hold; the lowering's tables (``UNARY_OPS``, the
binary table, the reductions of ``norm``) name its enum members, so covering the
schema's enums covers everything the lowering can emit. What each one computes
is registered by the op's own module (``@evaluates``, and a reference beside
each row of the unary, binary and reduction tables). A kind added to the schema
without one would otherwise surface only as a ``KeyError`` in the first test
that happens to lower it, or (before the reductions had their own table) as a
silently wrong result.
"""

from __future__ import annotations

import pytest
import rustconv.export.ops_lowering
from rustconv.devtools import reference
from rustconv.export.ir import OPS
from rustconv.export.ops_lowering.binary import BINARY_REFERENCE
from rustconv.export.ops_lowering.evaluators import evaluated_ops
from rustconv.export.ops_lowering.norm import REDUCE_REFERENCE
from rustconv.export.ops_lowering.unary import UNARY_REFERENCE
from rustconv.fb.BinaryOp import BinaryOp
from rustconv.fb.DType import DType
from rustconv.fb.Op import Op
from rustconv.fb.ReduceOp import ReduceOp
from rustconv.fb.UnaryOp import UnaryOp


def members(enum: type) -> dict[str, int]:
    """The members of a generated flatbuffers enum class, by name."""
    return {k: v for k, v in vars(enum).items() if not k.startswith("_") and isinstance(v, int)}


def op_kinds() -> dict[str, int]:
    """The ``Op`` union's tables (its ``NONE`` tag is no op)."""
    return {k: v for k, v in members(Op).items() if k != "NONE"}


@pytest.mark.parametrize(
    ("enum", "where", "covered"),
    [
        (Op, "the evaluators (@evaluates)", evaluated_ops()),
        (UnaryOp, "unary.UNARY_REFERENCE", UNARY_REFERENCE),
        (BinaryOp, "binary.BINARY_REFERENCE", BINARY_REFERENCE),
        (ReduceOp, "norm.REDUCE_REFERENCE", REDUCE_REFERENCE),
        (DType, "reference._TORCH_DTYPES", reference._TORCH_DTYPES),
        (DType, "reference._NUMPY_DTYPES", reference._NUMPY_DTYPES),
    ],
)
def test_reference_covers_every_schema_member(enum, where, covered):
    known = op_kinds() if enum is Op else members(enum)
    assert known, f"{enum.__name__} has no members: the generated class changed form"
    missing = sorted(name for name, code in known.items() if code not in covered)
    assert not missing, f"{where} lacks {enum.__name__} {missing}"
    unknown = sorted(set(covered) - set(known.values()))
    assert not unknown, f"{where} has codes {unknown} the schema lacks"


def test_each_evaluator_is_its_ops_module():
    """An evaluator is written in the package whose modules are discovered, so
    importing the package (as the interpreter does) finds every one."""
    modules = set(rustconv.export.ops_lowering.MODULES)
    for op_type, evaluate in evaluated_ops().items():
        assert evaluate.__module__ in modules, (op_type, evaluate.__module__)


def test_ir_knows_every_op_kind():
    """``rustconv.export.ir.OPS`` is the IR's registry of op kinds: the schema's, no more."""
    assert set(OPS) == set(op_kinds().values())
