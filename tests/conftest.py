"""Shared helpers for the end-to-end tests: lower a model, check that
RustConvBackend really took its ops, run the .pte through executorch.runtime
and through pte_runner."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "partitioner_py"))

import rustconv  # noqa: E402,F401  (registers torch.ops.rustconv.linear_scan)
import rustconv.runtime  # noqa: E402,F401  (loads the Rust backend)
from executorch.runtime import Runtime  # noqa: E402

ATOL = 1e-4


@pytest.fixture(scope="session", autouse=True)
def xnnpack_preprocess_memo():
    """XNNPACK's preprocess remembered by content for this test process
    (xnnpack_memo.py: the tests lower the same models more than once);
    RUSTCONV_TEST_XNNPACK_MEMO=0 turns it off."""
    if os.environ.get("RUSTCONV_TEST_XNNPACK_MEMO") == "0":
        yield None
        return
    import xnnpack_memo

    memo, uninstall = xnnpack_memo.install()
    yield memo
    uninstall()


@pytest.fixture(scope="session", autouse=True)
def cia_materialization_memo():
    """torch's composite-op materialization skipped while the dispatcher's
    registrations are unchanged (cia_memo.py); RUSTCONV_TEST_CIA_MEMO=0 turns
    it off."""
    if os.environ.get("RUSTCONV_TEST_CIA_MEMO") == "0":
        yield
        return
    import cia_memo

    uninstall = cia_memo.install()
    yield
    uninstall()


#: Work units handed to the test workers first (``--dist loadgroup`` hands
#: them out in collection order): the longest, ExecuTorch's LFM2 recipes
#: (two to three minutes of export), then each zoo model's group. Collected
#: last, as their directory sorts, one worker ran the recipes alone at the
#: end of the run while the other had finished.
_FIRST_GROUPS = ("lfm2-recipes", "zoo-")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        marker = item.get_closest_marker("xdist_group")
        name = (
            (marker.args[0] if marker.args else marker.kwargs.get("name", "")) if marker else None
        )
        return next(
            (i for i, g in enumerate(_FIRST_GROUPS) if name and name.startswith(g)),
            len(_FIRST_GROUPS),
        )

    items.sort(key=rank)  # stable: the collection's order within a rank


def pte_runner_path() -> Path:
    path = Path(os.environ.get("PTE_RUNNER", ROOT / "target" / "release" / "pte_runner"))
    if not path.is_file():
        pytest.fail(f"pte_runner not built at {path}: run scripts/setup.sh")
    return path


def delegate_backends(program) -> list[str]:
    """backend_id of every delegate call in the lowered program, in order."""
    return [d.id for d in program.executorch_program.execution_plan[0].delegates]


def assert_delegated(program, backend="RustConvBackend", ops=("convolution", "linear_scan")):
    """The program calls `backend` and runs none of `ops` outside a delegate:
    no silent fallback to portable kernels."""
    backends = delegate_backends(program)
    assert backend in backends, f"no {backend} delegate call; delegates: {backends}"
    plan = program.executorch_program.execution_plan[0]
    leftover = [op.name for op in plan.operators if any(o in op.name for o in ops)]
    assert not leftover, f"ran outside the delegate: {leftover}"


def save(program, tmp_path: Path, name="model.pte") -> Path:
    path = tmp_path / name
    path.write_bytes(program.buffer)
    return path


def run_runtime(pte: Path, inputs) -> list[torch.Tensor]:
    method = Runtime.get().load_program(str(pte)).load_method("forward")
    return list(method.execute(list(inputs)))


def run_pte_runner(pte: Path, inputs, tmp_path: Path, *extra: str) -> list[np.ndarray]:
    in_npz, out_npz = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(in_npz, **{str(i): t.numpy() for i, t in enumerate(inputs)})
    run = subprocess.run(
        [str(pte_runner_path()), "-model_path", str(pte), "-inputs_npz_path", str(in_npz),
         "-output_npz_path", str(out_npz), *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, f"pte_runner failed: {run.stderr[-2000:]}"
    with np.load(out_npz) as outputs:
        return [outputs[str(i)] for i in range(len(outputs.files))]


def assert_close(got, want, what="", atol=ATOL):
    got = torch.as_tensor(np.asarray(got))
    want = torch.as_tensor(np.asarray(want.detach() if torch.is_tensor(want) else want))
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert err <= atol, f"{what}: max abs error {err:.3e} > {atol:.0e}"


def input_sets(*shapes, seed=0):
    """Random, all-ones and ramp inputs of the given shapes (ramps span
    [-1, 1] so results stay O(1) and fp32 rounding stays far below ATOL)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "random": tuple(torch.randn(s, generator=gen) for s in shapes),
        "ones": tuple(torch.ones(s) for s in shapes),
        "ramp": tuple(torch.linspace(-1, 1, int(np.prod(s))).reshape(s) for s in shapes),
    }


class ConvActConv(torch.nn.Module):
    """A conv, an activation, a grouped conv: one RustConv call once the
    activation runs in the fused kernels."""

    def __init__(self, act):
        super().__init__()
        self.a = torch.nn.Conv1d(8, 8, 3, padding=1)
        self.act = act
        self.b = torch.nn.Conv1d(8, 8, 3, padding=1, groups=4)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


def zoo_example(name: str):
    """The zoo's model ``name`` at the tests' size (``tests/zoo/zoo_models.py``:
    the upstream module, its inputs and expected calls)."""
    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    import zoo_models

    return getattr(zoo_models, name)(False)


def run_activation_model(model, inputs, flow, tmp_path) -> tuple[int, list[str]]:
    """(RustConv calls, ops left outside any delegate) of ``model`` lowered by
    ``flow`` ("to_edge": RustConv alone; "transform": [RustConv, XNNPACK]),
    after checking both runtimes against eager."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from rustconv import RustConvPartitioner

    model = model.eval()
    with torch.no_grad():
        want = model(*inputs)
    if isinstance(want, tuple):  # a streaming model's (output, *states)
        want = want[0]
    ep = torch.export.export(model, inputs)
    if flow == "to_edge":
        edge = to_edge(ep).to_backend(RustConvPartitioner())
    else:
        edge = to_edge_transform_and_lower(
            ep, partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
        )
    delegate = torch.ops.higher_order.executorch_call_delegate
    leftover = [
        str(n.target)
        for n in edge.exported_program().graph_module.graph.nodes
        if n.op == "call_function" and n.target is not delegate and "getitem" not in n.name
    ]
    program = edge.to_executorch()
    pte = save(program, tmp_path)
    atol = 1e-4 * max(1.0, want.abs().max().item())
    assert_close(run_runtime(pte, inputs)[0], want, f"{flow} runtime", atol)
    assert_close(run_pte_runner(pte, inputs, tmp_path)[0], want, f"{flow} pte_runner", atol)
    return delegate_backends(program).count("RustConvBackend"), leftover
