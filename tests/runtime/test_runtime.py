"""Loading the Rust runtime, and running exported programs through it.

The end-to-end tests need the compiled backend (``cargo build --release``)
and are skipped without it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rustconv
import torch
from rustconv_test_helpers import lower, lowered_modules
from torch import nn
from torch.export import Dim


def test_missing_library_names_paths_and_build_command(tmp_path):
    # In a fresh interpreter: once any test has loaded the backend, this
    # process can no longer see what a missing library does.
    missing = tmp_path / "librustconv_backend.so"
    check = (
        "import sys\n"
        "try:\n"
        "    import rustconv.runtime\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "    sys.exit(0 if 'rustconv.runtime' not in sys.modules else 2)\n"
        "sys.exit(1)\n"
    )
    env = {**os.environ, "RUSTCONV_BACKEND_LIB": str(missing)}
    run = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert str(missing) in run.stdout and "cargo build --release" in run.stdout


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_import_rustconv_does_not_load_the_runtime():
    """Only ``rustconv.runtime`` may import ``executorch.runtime`` or load the library.

    Checked on the source (a subprocess import would cost seconds of torch start-up).
    """
    package = Path(rustconv.__file__).parent
    # runtime.py loads the library; devtools' inspect and profile are
    # command-line tools (python -m rustconv.inspect / rustconv.profile) that
    # ask it for plans, and devtools/testing.py (imported only by tests) runs
    # programs; their modules at the old top-level paths re-export them.
    # Nothing else in the package imports them.
    loaders = {"runtime.py", "inspect.py", "profile.py", "testing.py"}
    loaders |= {f"devtools/{name}" for name in loaders}
    for path in package.rglob("*.py"):
        imported = _imported_modules(path)
        if path.relative_to(package).as_posix() in loaders:
            continue
        for module in (
            "rustconv.runtime",
            "rustconv.inspect",
            "rustconv.devtools.inspect",
            "executorch.runtime",
            "ctypes",
        ):
            assert module not in imported, f"{path.relative_to(package)} imports {module}"


@pytest.fixture(scope="module")
def runtime():
    try:
        import rustconv.runtime
    except ImportError as e:
        pytest.skip(f"RustConv backend library not available: {e}")
    return rustconv.runtime


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        # Even kernel: conv1d.padding("same") or pad + convolution, by flow.
        self.a = nn.Conv1d(4, 8, 4, padding="same")
        self.b = nn.Conv1d(8, 8, 4, stride=2, groups=4, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, x, decay, x0):
        h = self.a(x)
        y = torch.ops.rustconv.linear_scan(x0, decay, h)
        return self.head(self.b(y).mean(dim=-1))


def _inputs(seq):
    g = torch.Generator().manual_seed(seq)
    return (
        torch.randn(2, 4, seq, generator=g),
        torch.rand(2, 8, seq, generator=g),
        torch.randn(2, 8, generator=g),
    )


@pytest.mark.parametrize("flow", ["to_edge", "transform", "transform+xnnpack"])
def test_end_to_end_matches_eager(runtime, flow):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner,
    )
    from executorch.runtime import Runtime

    assert runtime.is_loaded()
    torch.manual_seed(0)
    model = Model().eval()
    seq = Dim("seq", min=4, max=128)
    partitioners = [rustconv.RustConvPartitioner()]
    if flow.endswith("+xnnpack"):
        flow = flow.split("+")[0]
        partitioners.append(XnnpackPartitioner())
    edge = lower(
        model,
        _inputs(32),
        flow,
        dynamic_shapes=({2: seq}, {2: seq}, None),
        partitioners=partitioners,
    )
    assert lowered_modules(edge)
    pte = edge.to_executorch().buffer
    method = Runtime.get().load_program(pte).load_method("forward")
    for length in (32, 7, 128):
        inputs = _inputs(length)
        (actual,) = method.execute(list(inputs))
        torch.testing.assert_close(actual, model(*inputs), atol=1e-4, rtol=1e-4)
