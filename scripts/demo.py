"""The main job: export a small gated causal-conv + scan block with
RustConvPartitioner, run the .pte in pte_runner, and check it against eager."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from executorch.exir import to_edge
from rustconv import RustConvPartitioner
from torch.export import export

TOLERANCE = 1e-4


class GatedConvScan(torch.nn.Module):
    """Short causal depthwise conv, a pointwise mix, then a linear scan whose
    decay comes from a learned gate (computed by ExecuTorch's CPU kernels)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.short = torch.nn.Conv1d(channels, channels, kernel, groups=channels)
        self.mix = torch.nn.Conv1d(channels, channels, 1)

    def forward(self, x, gate, x0):
        h = self.short(F.pad(x, (self.kernel - 1, 0)))
        u = self.mix(h)
        return torch.ops.rustconv.linear_scan(x0, torch.sigmoid(gate), u)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runner", type=Path, required=True)
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--iter", type=int, default=50)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GatedConvScan(args.channels, kernel=4).eval()
    inputs = (
        torch.randn(1, args.channels, args.length),
        torch.randn(1, args.channels, args.length),
        torch.randn(1, args.channels),
    )
    program = to_edge(export(model, inputs)).to_backend(RustConvPartitioner()).to_executorch()
    code = program.exported_program().graph_module.code
    delegated = len(re.findall(r"executorch_call_delegate\(", code))
    if delegated == 0:
        print("error: nothing was delegated to RustConvBackend", file=sys.stderr)
        return 1

    args.out.mkdir(parents=True, exist_ok=True)
    pte = args.out / "gated_conv_scan.pte"
    pte.write_bytes(program.buffer)
    np.savez(args.out / "inputs.npz", **{str(i): t.numpy() for i, t in enumerate(inputs)})
    print(f"exported {pte} ({pte.stat().st_size} bytes, {delegated} RustConvBackend call(s))")

    run = subprocess.run(
        [
            str(args.runner),
            "-model_path", str(pte),
            "-inputs_npz_path", str(args.out / "inputs.npz"),
            "-output_npz_path", str(args.out / "outputs.npz"),
            "-etdump_path", str(args.out / "trace.etdump"),
            "-warmup", "3",
            "-iter", str(args.iter),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    sys.stdout.write(run.stdout)
    if run.returncode != 0:
        sys.stderr.write(run.stderr)
        return run.returncode

    got = np.load(args.out / "outputs.npz")["0"]
    want = model(*inputs).detach().numpy()
    err = float(np.abs(got - want).max())
    verdict = "matches" if err <= TOLERANCE else "DOES NOT match"
    print(f"{verdict} PyTorch eager: max abs error {err:.2e} (tolerance {TOLERANCE:.0e})")
    print(f"ETDump trace for executorch.devtools.Inspector: {args.out / 'trace.etdump'}")
    return 0 if err <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
