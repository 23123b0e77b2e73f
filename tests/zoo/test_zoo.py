"""The model zoo (zoo_models.py): upstream models, lowered with
``[RustConvPartitioner(), XnnpackPartitioner()]``, checked for

* the number of RustConv calls the goal says, and why (the model's ``why``);
* what RustConv leaves to others, and why (``explain()``, grouped);
* outputs equal to eager within 1e-4 times each output's scale, prefill and
  decode steps, in ``executorch.runtime`` and in pte_runner (2 threads);
* rule one (issue 16): lowering with and without RustConv leaves everything
  outside RustConv's calls the same (test_rule_one_invariance).

The default run uses the small sizes; ``RUSTCONV_ZOO_FULL=1`` runs the full
ones (the models' real widths) and the entries too slow for the default
run. A check that fails today for a reason another helper owns is
``xfail(strict=True)`` naming it (``ZooModel.known_failures``): when the fix
merges the test passes, the strict xfail fails, and the mark comes off.
"""

from __future__ import annotations

import os

import pytest
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import EdgeCompileConfig
from rustconv.devtools.testing import check_others_unchanged, transform_and_lower
from torch.export import export
from zoo_harness import Lowered, lower, run_in_pte_runner, run_in_runtime
from zoo_models import MODELS, ZooModel

FULL = os.environ.get("RUSTCONV_ZOO_FULL") == "1"
# Each model's tests run in one test worker (pytest -n: --dist loadgroup), which
# lowers the model once for all of them (``lowered``).
NAMES = [
    pytest.param(name, marks=pytest.mark.xdist_group(f"zoo-{name}"))
    for name, model in MODELS.items()
    if FULL or not model.slow
]

pytestmark = pytest.mark.filterwarnings(
    "ignore:_check_is_size:FutureWarning",
    "ignore:Mutation on a buffer:UserWarning",
    "ignore::torch.jit.TracerWarning",
)

_LOWERED: dict[str, Lowered | BaseException] = {}


def lowered(name: str, tmp_path_factory) -> Lowered:
    """The model built, exported, explained and lowered once per session
    (every test of a model shares it). A failure to build, export or explain
    is re-raised in each test; a lowering failure by those that need the
    programs (``Lowered.programs``)."""
    if name not in _LOWERED:
        try:
            example = MODELS[name].build(FULL)
            _LOWERED[name] = lower(example, tmp_path_factory.mktemp(name))
        except Exception as e:  # noqa: BLE001  (kept and re-raised per test)
            _LOWERED[name] = e
    result = _LOWERED[name]
    if isinstance(result, BaseException):
        raise result
    return result


def expect(request, model: ZooModel, *checks: str) -> None:
    """xfail(strict=True) for the first of ``checks`` that is a known failure:
    a failed assertion, or for "lower" the lowering's own exception (any
    other exception is a real failure)."""
    for check in checks:
        if check in model.known_failures:
            raises = None if check == "lower" else AssertionError
            mark = pytest.mark.xfail(strict=True, raises=raises, reason=model.known_failures[check])
            request.applymarker(mark)
            return


@pytest.mark.parametrize("name", NAMES)
def test_rustconv_calls(name, request, tmp_path_factory):
    model = MODELS[name]
    expect(request, model, "lower", "calls")
    low = lowered(name, tmp_path_factory)
    for program in low.programs:
        assert program.rustconv_calls == low.example.rustconv_calls, (
            f"{name}: {program.rustconv_calls} RustConv calls (and {program.xnnpack_calls} "
            f"XNNPACK), expected {low.example.rustconv_calls}: {low.example.why}. "
            f"Left out (explain): {sorted(low.outside)}"
        )


@pytest.mark.parametrize("name", NAMES)
def test_what_stays_outside(name, request, tmp_path_factory):
    """explain()'s model-specific reasons are exactly the expected ones: an
    op RustConv does not run, or a reason of its own ("op: why")."""
    model = MODELS[name]
    expect(request, model, "outside")
    outside = lowered(name, tmp_path_factory).outside
    unexpected = {k: v[:3] for k, v in outside.items() if k not in model.outside}
    missing = sorted(set(model.outside) - set(outside))
    assert not unexpected and not missing, (
        f"{name}: left out unexpectedly (op or reason: nodes): {unexpected}; "
        f"expected but not left out: {missing}"
    )


@pytest.mark.parametrize("name", NAMES)
def test_matches_eager_in_executorch_runtime(name, request, tmp_path_factory):
    model = MODELS[name]
    expect(request, model, "lower", "accuracy", "runtime")
    problems = run_in_runtime(lowered(name, tmp_path_factory))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_matches_eager_in_pte_runner(name, request, tmp_path_factory, tmp_path):
    model = MODELS[name]
    expect(request, model, "lower", "accuracy", "pte_runner")
    problems = run_in_pte_runner(lowered(name, tmp_path_factory), tmp_path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_rule_one_invariance(name, request, tmp_path_factory):
    """Lowered with XNNPACK alone, with RustConv first and (full runs) last:
    what XNNPACK sees and everything outside RustConv's calls is the same
    (:func:`rustconv.devtools.testing.check_others_unchanged`). The lowering
    with RustConv first is the one the other tests run (``lowered``), where
    it succeeded."""
    model = MODELS[name]
    expect(request, model, "rule_one")
    low = lowered(name, tmp_path_factory)
    example = low.example
    config = EdgeCompileConfig(**(example.edge_compile_config or {}))
    check_others_unchanged(
        transform_and_lower(
            lambda: export(
                example.module,
                example.inputs,
                dynamic_shapes=example.dynamic_shapes,
                strict=example.strict,
            ),
            compile_config=config,
        ),
        others=lambda: [XnnpackPartitioner()],
        min_rustconv_calls=min(example.rustconv_calls, 1),
        orders=("first", "last") if FULL else ("first",),
        first=low.first,
    )
