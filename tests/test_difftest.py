"""Differential testing on random models (``tests/difftest``).

* A fixed-seed batch of random programs through both lowering flows and
  both runners, compared with eager (the long run is
  ``scripts/fuzz_models.sh``).
* Every kept reproducer in ``tests/difftest/regressions/`` replayed. Those
  that pass run merged into as few programs as possible (one export and
  lowering per group, as the long run does); those marked ``xfail`` (a bug
  owned elsewhere, reason in the file) run alone, strict, so a fix shows up.
* The harness itself: the tolerance, the generator's determinism and
  coverage, and the shrinker on a synthetic predicate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from difftest import speed  # noqa: E402
from difftest.check import Checker, Failure, Result, compare, output_dtype  # noqa: E402
from difftest.generate import generate_graph, generate_program  # noqa: E402
from difftest.shrink import shrink, size  # noqa: E402
from difftest.spec import n_calls, single  # noqa: E402
from difftest.triage import _explained_by_baseline, error_class, known_or_repaired  # noqa: E402

REGRESSIONS = Path(__file__).resolve().parent / "difftest" / "regressions"

#: The fixed batch: (program seed, models per program): stateful, static, dynamic.
BATCH = [(0, 2), (1, 3), (5, 3)]


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    speed.install()
    c = Checker(tmp_path_factory.mktemp("difftest"))
    yield c
    c.close()


def test_fixed_seed_batch(checker):
    """Every model of the batch matches eager in every flow and runner, or hits
    a bug already kept as an xfail regression (:mod:`difftest.known`: the
    failure goes away when that bug's trigger is taken out of the model)."""
    failures, known = [], []
    models = 0
    for seed, graphs in BATCH:
        program = generate_program(seed, graphs=graphs)
        result = checker.check(program)
        models += result.models
        assert len(result.invalid) <= graphs // 2, f"seed {seed}: {result.invalid}"
        first: dict = {}
        for f in result.failures:
            first.setdefault(f.graph, (f, sum(1 for g in result.failures if g.graph == f.graph)))
        for graph, (f, count) in first.items():
            rebuild = f"generate_program({seed}, graphs={graphs})"
            wanted = error_class(f)

            def predicate(spec, f=f, wanted=wanted):
                runners = (f.runner,) if f.runner else ()
                return any(
                    error_class(g) == wanted
                    for g in checker.check(spec, (f.flow,), runners).failures
                )

            suspect = single(program, graph) if graph is not None else program
            bug, _ = known_or_repaired(suspect, predicate, f.flow)
            if bug is not None:
                known.append(f"seed {seed} graph {graph}: {bug.id}")
                continue
            if graph is not None:
                rebuild = f"single({rebuild}, {graph})"
            failures.append(f"{f.describe()} [{count} failures in all]; rebuild: {rebuild}")
    assert models >= 6
    assert not failures, f"seeds {[s for s, _ in BATCH]}:\n" + "\n".join(failures)
    print(f"{models} models; known bugs hit: {known}")


# -- regressions -------------------------------------------------------------


def _entries() -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text())) for p in sorted(REGRESSIONS.glob("*.json"))]


def _params():
    out = []
    for path, entry in _entries():
        marks = []
        if entry.get("xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=entry["xfail"]))
        out.append(pytest.param(path, marks=marks, id=path.stem))
    return out


@pytest.fixture(scope="module")
def merged_results(checker):
    """Results of the passing regressions, checked in groups of one mode and call count."""
    groups: dict[tuple, list[tuple[Path, dict]]] = {}
    for path, entry in _entries():
        program = entry["program"]
        if entry.get("xfail") or len(program["graphs"]) != 1:
            continue
        key = (program["mode"], n_calls(program), program.get("threads", 2))
        groups.setdefault(key, []).append((path, program))
    results: dict[Path, list[str]] = {}
    for members in groups.values():
        for start in range(0, len(members), 12):
            chunk = members[start : start + 12]
            merged = dict(chunk[0][1])
            merged["graphs"] = [program["graphs"][0] for _, program in chunk]
            result = checker.check(merged)
            if any(f.graph is None for f in result.failures) or result.invalid:
                continue  # attributed one by one instead
            for gi, (path, _) in enumerate(chunk):
                results[path] = [f.describe() for f in result.failures if f.graph == gi]
    return results


@pytest.mark.parametrize("path", _params())
def test_regression(path, checker, merged_results):
    entry = json.loads(path.read_text())
    if path in merged_results:
        failures = merged_results[path]
    else:
        result = checker.check(entry["program"])
        assert not result.invalid, f"{path.name}: spec no longer valid: {result.invalid}"
        failures = [f.describe() for f in result.failures]
    assert not failures, f"{path.name} ({entry.get('found')}):\n" + "\n".join(failures)


# -- the harness itself -------------------------------------------------------


def test_compare_tolerance():
    import torch

    ref = torch.linspace(-2, 2, 50, dtype=torch.float64).reshape(1, 2, 25)
    eager = ref.float()
    assert compare(eager.numpy(), eager, ref, "float32") is None
    off = eager.clone()
    off[0, 1, 3] += 1e-3  # 1e-4 * scale (2) + 1e-5 is 2.1e-4
    numbers = compare(off.numpy(), eager, ref, "float32")
    assert numbers is not None and numbers["index"] == [0, 1, 3] and numbers["bad"] == 1
    assert compare(eager[..., :-1].numpy(), eager, ref, "float32")["shape"] == [1, 2, 24]
    half = ref.half()
    assert compare((half + 1e-3).numpy(), half, ref, "float16") is None
    assert compare((half + 2e-2).numpy(), half, ref, "float16") is not None
    nan = eager.clone()
    nan[0, 0, 0] = float("nan")
    assert compare(nan.numpy(), eager, ref, "float32")["index"] == [0, 0, 0]


def test_outputs_after_a_narrowing_cast_take_that_dtypes_tolerance():
    """An output downstream of a cast of a computed value to float16 or
    bfloat16 is compared in that dtype (the seed 43009 regression); a cast
    of a leaf is exact everywhere and changes nothing."""
    graph = {
        "dtype": "float32",
        "ops": [
            {"out": "c", "op": "conv", "x": "x", "w": "w"},
            {"out": "h", "op": "cast", "x": "c", "to": "float16"},
            {"out": "b", "op": "cast", "x": "h", "to": "bfloat16"},
            {"out": "hb", "op": "cast", "x": "b", "to": "float32"},
            {"out": "h32", "op": "cast", "x": "h", "to": "float32"},
            {"out": "w16", "op": "cast", "x": "w", "to": "float16"},
            {"out": "w32", "op": "cast", "x": "w16", "to": "float32"},
            {"out": "s", "op": "binary", "fn": "add", "a": "c", "b": "h32"},
        ],
        "outputs": ["c", "h32", "hb", "w32", "s"],
    }
    got = {name: output_dtype(graph, name) for name in graph["outputs"]}
    assert got == {
        "c": "float32", "h32": "float16", "hb": "bfloat16", "w32": "float32", "s": "float16",
    }  # fmt: skip
    # One float16 ulp at 1.375 fails float32's tolerance, not float16's.
    ref = torch.tensor([1.3759765625, 0.5], dtype=torch.float64)
    off = torch.tensor([1.375, 0.5])
    assert compare(off.numpy(), ref.float(), ref, "float32") is not None
    assert compare(off.numpy(), ref.float(), ref, "float16") is None


def test_triage_compares_a_shrunk_program_with_its_own_baseline():
    """A mismatch shrunk to a smaller error whose baseline fails as badly as
    the shrunk program is not ours, though the baseline's error is under
    half the original failure's; a baseline far below ours, or none, leaves
    it ours."""

    def mismatch(err: float) -> Failure:
        return Failure("mismatch", "edge", "runtime", graph=0, numbers={"max_err": err})

    original = mismatch(0.0725)
    wanted = error_class(original)
    shrunk, base = Result({}, [mismatch(0.031)]), Result({}, [mismatch(0.030)])
    assert not _explained_by_baseline(original, base, wanted)
    assert _explained_by_baseline(original, base, wanted, mine=shrunk)
    far_below = Result({}, [mismatch(0.001)])
    assert not _explained_by_baseline(original, far_below, wanted, mine=shrunk)
    assert not _explained_by_baseline(original, Result({}), wanted, mine=shrunk)


def test_generator_is_deterministic_and_covers_every_op_kind():
    from difftest.ops import KINDS

    assert generate_program(3, graphs=3) == generate_program(3, graphs=3)
    assert json.loads(json.dumps(generate_program(4, graphs=2))) == generate_program(4, graphs=2)
    seen, convs = set(), []
    for seed in range(100):
        graph = generate_graph(seed, ["static", "dynamic", "stateful"][seed % 3])
        seen |= {op["op"] for op in graph["ops"]}
        convs += [op for op in graph["ops"] if op["op"] == "conv"]
    missing = set(KINDS) - seen
    assert not missing, f"op kinds no graph of 100 used: {missing}"
    assert {c.get("stride", 1) for c in convs} >= {1, 2}
    assert {c.get("dilation", 1) for c in convs} >= {1, 2}
    assert {str(c.get("padding", 0)) for c in convs} >= {"0", "same", "valid"}
    assert any(c.get("groups", 1) > 1 for c in convs)


def test_shrinker_finds_the_smallest_model_that_still_fails():
    """A synthetic bug: "a conv of stride 2 fails". The shrinker keeps one
    conv of stride 2 and drops everything else it can."""

    def has_strided_conv(program):
        return any(
            op["op"] == "conv" and op.get("stride") == 2
            for g in program["graphs"]
            for op in g["ops"]
        )

    seed = next(
        s for s in range(200) if has_strided_conv(generate_program(s, graphs=3, mode="static"))
    )
    program = generate_program(seed, graphs=3, mode="static")
    small = shrink(program, has_strided_conv, budget_s=120)
    assert has_strided_conv(small)
    assert size(small)[0] == 1
    ops = small["graphs"][0]["ops"]
    assert [op["op"] for op in ops] == ["conv"], ops
    assert size(small) < size(program)


def test_known_bugs_recognise_their_regressions_and_repairs_remove_the_trigger():
    """Each known bug applies to its kept reproducer, and its repair leaves a
    valid model it no longer applies to (no export: the specs only)."""
    from difftest.generate import probe_graph
    from difftest.known import KNOWN_BUGS

    for bug in KNOWN_BUGS:
        if bug.regression is None:
            continue
        entry = json.loads((REGRESSIONS / bug.regression).read_text())
        assert entry["xfail"], f"{bug.id}: its regression is not marked xfail"
        (graph,) = entry["program"]["graphs"]
        assert bug.applies(graph), bug.id
        repaired = bug.repair(graph)
        probe_graph(repaired)
        assert not bug.applies(repaired), bug.id


#: Seed 52031's shrunk failure (fuzz, stop 45): a float16 conv, ExecuTorch's
#: portable cumsum between two RustConv calls, a transposed conv and a scan.
#: Given the cumsum's output it receives, RustConv's result was within a
#: quarter float16 ulp of float64; the cumsum (running sum kept in float16)
#: was not, and the scan took that to 5 ulps of eager.
_HALF_CUMSUM = {
    "seed": 210697501275, "mode": "static", "dtype": "float16", "time": 57, "tmin": 57,
    "tmax": 57, "calls": [57],
    "inputs": {"x12": {"shape": [12, 3, 4]}, "xv11": {"shape": [1, 3, "T"]},
               "xv22": {"shape": [1, 3, "T+3"]}},
    "params": {"p17": {"shape": [12, 3, 3], "init": "normal"},
               "pv23": {"shape": [1, 3], "init": "normal"}},
    "buffers": {},
    "ops": [
        {"out": "v13", "op": "conv", "x": "xv11", "w": "x12", "b": None, "padding": 3},
        {"out": "v15", "op": "cumsum", "x": "v13", "dim": 2},
        {"out": "v18", "op": "slice", "x": "p17", "dim": 2, "start": 1, "end": 2},
        {"out": "v20", "op": "conv_transpose", "x": "v15", "w": "v18"},
        {"out": "v24", "op": "scan", "x0": "pv23", "a": "xv22", "u": "v20"},
    ],
    "outputs": ["v24"],
}  # fmt: skip


def test_the_half_cumsum_bug_applies_to_narrow_cumsums_and_its_repair_widens_them():
    """The upstream known bug ``portable_half_cumsum`` applies to seed
    52031's reproducer in both flows; its repair (the cumsum between casts to
    float32 and back, what eager computes) leaves a valid model it no longer
    applies to; a cumsum of float32 values in a float16 graph, or of a float32
    graph, is not one it applies to."""
    from difftest.generate import probe_graph
    from difftest.known import KNOWN_BUGS, applicable

    (bug,) = [b for b in KNOWN_BUGS if b.id == "portable_half_cumsum"]
    assert bug.upstream
    for flow in ("edge", "xnn"):
        assert bug in applicable(_HALF_CUMSUM, flow)
    repaired = bug.repair(_HALF_CUMSUM)
    probe_graph(repaired)
    assert not bug.applies(repaired)
    assert [op["op"] for op in repaired["ops"]][:4] == ["conv", "cast", "cumsum", "cast"]
    assert not bug.applies({**_HALF_CUMSUM, "dtype": "float32"})
    # In a float32 graph, a cumsum a cast makes float16 is one; its repair
    # hands on float16 values, as the cumsum did, not the graph's dtype.
    cast = {"out": "v14", "op": "cast", "x": "v13", "to": "float16"}
    ops = _HALF_CUMSUM["ops"]
    wide = {**_HALF_CUMSUM, "dtype": "float32",
            "ops": [ops[0], cast, {**ops[1], "x": "v14"}, *ops[2:]]}  # fmt: skip
    assert bug.applies(wide)
    back = [op for op in bug.repair(wide)["ops"] if op["op"] == "cast"][-1]
    assert (back["out"], back["to"]) == ("v15", "float16")


def test_eager_reference_returns_on_the_conv_onednn_never_finishes():
    """Seed 500061 of the long run stalled it for an hour: its float16
    depthwise conv (x [2, 12, 71], w [12, 1, 31], groups 12) never returned
    from oneDNN's kernel generation in torch 2.14.1. The eager runs of the
    differential tests go around oneDNN; in a subprocess, so a regression
    fails on the timeout rather than hanging the suite."""
    import subprocess

    code = (
        "import sys; sys.path.insert(0, 'tests');"
        "from difftest.check import DiffModel, _run_eager;"
        "from difftest.generate import generate_program;"
        "from difftest.spec import n_calls;"
        "from difftest.check import call_inputs;"
        "p = generate_program(500061, graphs=8);"
        "_run_eager(DiffModel(p), [call_inputs(p, k) for k in range(n_calls(p))]);"
        "print('returned')"
    )
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "returned" in run.stdout


def test_reference_of_a_where_between_two_scalars_stays_float64():
    """Seed 600055, graph 1: ``where(c, 3.0, 0.5)`` (torch's default dtype,
    float32) fed a conv whose float64 reference weights then refused it, and
    the error ended the long run's worker. The reference computes such a
    ``where`` in float64 too."""
    from difftest.check import DiffModel, _run_eager, call_inputs
    from difftest.spec import subset

    one = subset(generate_program(600055, graphs=8), [1])
    calls = [call_inputs(one, k, reference=True) for k in range(n_calls(one))]
    outputs = _run_eager(DiffModel(one, reference=True), calls, margins=[])
    assert all(o.dtype == torch.float64 for call in outputs for o in call)
