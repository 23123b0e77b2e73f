"""Smoke test of an installed rustconv wheel, run by scripts/test.sh with the
Python of a throwaway environment the wheel was installed into, from a
directory outside the checkout, with no PYTHONPATH and no
RUSTCONV_BACKEND_LIB: everything must come from the installed package.

    python wheel_smoke.py WORK_DIR
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import rustconv
import rustconv.runtime
import torch
from executorch.exir import to_edge
from executorch.runtime import Runtime
from rustconv import RustConvPartitioner, native
from torch.export import export

WORK = Path(sys.argv[1])
SITE = Path(sysconfig.get_paths()["purelib"])


class ConvScan(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 4, groups=8)

    def forward(self, x, a, x0):
        u = self.conv(torch.nn.functional.pad(x, (3, 0)))
        return torch.ops.rustconv.linear_scan(x0, a, u)


def check(condition, what):
    if not condition:
        sys.exit(f"wheel smoke test FAILED: {what}")


def python(*args, env=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)


# The package and the library are the installed ones.
package = Path(rustconv.__file__).parent
check(package == SITE / "rustconv", f"rustconv imported from {package}, not {SITE}")
check(rustconv.runtime.library_path() == package / "librustconv_backend.so",
      f"runtime loaded {rustconv.runtime.library_path()}")  # fmt: skip

# Export with the partitioner; the delegate really runs.
torch.manual_seed(0)
model = ConvScan().eval()
inputs = (torch.randn(1, 8, 64), torch.rand(1, 8, 64), torch.randn(1, 8))
program = to_edge(export(model, inputs)).to_backend(RustConvPartitioner()).to_executorch()
delegates = [d.id for d in program.executorch_program.execution_plan[0].delegates]
check(delegates == ["RustConvBackend"], f"delegates {delegates}")
pte = WORK / "model.pte"
pte.write_bytes(program.buffer)
want = model(*inputs).detach().numpy()

# executorch.runtime.
got = Runtime.get().load_program(str(pte)).load_method("forward").execute(list(inputs))[0]
err = np.abs(got.numpy() - want).max()
check(err <= 1e-4, f"executorch.runtime max abs error {err}")

# The pte_runner command on PATH (the environment's bin/).
runner = shutil.which("pte_runner", path=str(Path(sys.executable).parent))
check(runner is not None, "no pte_runner command in the environment")
np.savez(WORK / "in.npz", **{str(i): t.numpy() for i, t in enumerate(inputs)})
run = subprocess.run(
    [runner, "-model_path", str(pte), "-inputs_npz_path", str(WORK / "in.npz"),
     "-output_npz_path", str(WORK / "out.npz")],
    capture_output=True, text=True,
)  # fmt: skip
check(run.returncode == 0, f"pte_runner failed: {run.stderr[-2000:]}")
check("RustConvBackend: plan:" in run.stderr, "pte_runner ran no RustConv plan")
with np.load(WORK / "out.npz") as out:
    err = np.abs(out["0"] - want).max()
check(err <= 1e-4, f"pte_runner max abs error {err}")

# python -m rustconv.inspect.
run = python("-m", "rustconv.inspect", str(pte))
check(run.returncode == 0 and "linear_scan" in run.stdout, f"inspect: {run.stdout}{run.stderr}")

# python -m rustconv.profile runs the installed pte_runner with an ETDump.
run = python("-m", "rustconv.profile", str(pte), "--iter", "3", "--json", str(WORK / "prof.json"))
check(run.returncode == 0, f"profile: {run.stdout}{run.stderr[-2000:]}")
check("linear_scan" in (WORK / "prof.json").read_text(), "profile JSON names no linear_scan")

# RUSTCONV_BACKEND_LIB still overrides the library, and a library built for
# another executorch is refused at import, naming it (one Python start for both:
# the refusal names the overriding copy).
copy = WORK / "librustconv_backend_copy.so"
shutil.copyfile(package / "librustconv_backend.so", copy)
env = {**os.environ, "RUSTCONV_BACKEND_LIB": str(copy)}
version = native.built_for(copy)
check(version == native.installed_executorch(), f"built for {version}")
data = copy.read_bytes()
fake = "9.9.9".ljust(len(version), "9")[: len(version)]  # same length: the ELF stays intact
copy.write_bytes(data.replace(f"EXECUTORCH={version}\0".encode(), f"EXECUTORCH={fake}\0".encode()))
run = python("-c", "import rustconv.runtime", env=env)
check(run.returncode != 0 and "built for executorch 9.9" in run.stderr
      and "executorch 1." in run.stderr and "Traceback" in run.stderr,
      f"mismatch not refused clearly: {run.stderr[-1500:]}")  # fmt: skip
check("ImportError" in run.stderr and "undefined symbol" not in run.stderr, run.stderr[-1500:])
check(str(copy) in run.stderr, f"the override was not loaded: {run.stderr[-1500:]}")

print(f"wheel smoke test passed: {package}")
