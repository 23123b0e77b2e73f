"""cia_memo.py: torch's composite-op materialization runs again exactly when
the dispatcher's composite registrations change."""

import cia_memo
import torch
import torch._export.utils as export_utils


def test_materialization_runs_again_only_after_a_registration(monkeypatch):
    runs = []
    monkeypatch.setattr(export_utils, "_materialize_cpp_cia_ops", lambda: runs.append(1))
    uninstall = cia_memo.install()
    try:
        materialize = export_utils._materialize_cpp_cia_ops
        materialize()
        materialize()
        assert len(runs) == 1
        lib = torch.library.Library("rustconv_test_cia", "DEF")  # noqa: TOR901
        lib.define("double(Tensor x) -> Tensor")
        lib.impl("double", lambda x: x * 2, "CompositeImplicitAutograd")
        materialize()
        assert len(runs) == 2, "a new composite op was not materialized"
        materialize()
        assert len(runs) == 2
        del lib  # dropping the op changes the registrations too
        materialize()
        assert len(runs) == 3
    finally:
        uninstall()
    assert export_utils._materialize_cpp_cia_ops is not materialize
