"""The main job: lower two real blocks with RustConvPartitioner (then XNNPACK for
the linears) and with XNNPACK alone, run every .pte in pte_runner at the same
thread count, check each against PyTorch eager, and show what the backend
fused.

The blocks (``rustconv.examples.blocks``):

* transformers' ``Lfm2ShortConv``, the gated short convolution of LFM2 with its
  two projections: everything between the projections is one RustConv call;
* a diagonal state-space block (softplus step size, exponential decay, linear
  scan, SiLU gate): one RustConv call, which XNNPACK alone can only run with the
  scan in ExecuTorch's portable kernel.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from rustconv import RustConvPartitioner
from rustconv.devtools.inspect import delegate_calls, plan_blob
from rustconv.examples.blocks import DiagonalSSM, Lfm2ShortConvHF
from torch.export import export

TOLERANCE = 1e-3  # the project's accuracy bar against eager (fp32)


def lower(model, inputs, partitioners):
    program = to_edge_transform_and_lower(export(model, inputs), partitioner=partitioners)
    code = program.exported_program().graph_module.code
    return program.to_executorch(), len(re.findall(r"executorch_call_delegate\(", code))


def run(runner: Path, pte: Path, inputs_npz: Path, outputs_npz: Path, iters: int, extra=()):
    cmd = [
        str(runner),
        "-model_path", str(pte),
        "-inputs_npz_path", str(inputs_npz),
        "-output_npz_path", str(outputs_npz),
        "-warmup", "3",
        "-iter", str(iters),
        *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(done.returncode)
    p50 = float(re.search(r"p50 ([0-9.]+) ms", done.stdout).group(1))
    peak = re.search(r"peak memory: ([^\n]+) above the inputs", done.stdout).group(1)
    return p50, peak


def demo_block(name, model, inputs, args) -> bool:
    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    inputs_npz = out / "inputs.npz"
    np.savez(inputs_npz, **{str(i): t.numpy() for i, t in enumerate(inputs)})
    want = model(*inputs).detach().numpy()
    print(f"== {name}: inputs {[tuple(t.shape) for t in inputs]}")

    ok = True
    results = {}
    for label, partitioners in [
        ("RustConv + XNNPACK", [RustConvPartitioner(), XnnpackPartitioner()]),
        ("XNNPACK alone", [XnnpackPartitioner()]),
    ]:
        program, calls = lower(model, inputs, partitioners)
        pte = out / f"{'ours' if label.startswith('Rust') else 'xnnpack'}.pte"
        pte.write_bytes(program.buffer)
        extra = ("-etdump_path", str(out / "trace.etdump")) if label.startswith("Rust") else ()
        p50, peak = run(args.runner, pte, inputs_npz, out / "outputs.npz", args.iter, extra)
        err = float(np.abs(np.load(out / "outputs.npz")["0"] - want).max())
        ok &= err <= TOLERANCE
        results[label] = p50
        print(
            f"  {label:<19} {p50:9.3f} ms  peak {peak:>10}  {calls} delegate call(s)  "
            f"max abs error {err:.1e}"
        )
        if label.startswith("Rust"):
            for call in delegate_calls(program.buffer):
                plan = plan_blob(call.blob, call.compile_specs)
                absorbed = sum(len(k["absorbed"]) for k in plan["kernels"])
                print(
                    f"    RustConv call {call.index}: {absorbed} ops in {len(plan['kernels'])} "
                    f"fused kernel(s), arena {plan['arena_bytes'] / 2**20:.1f} MiB"
                )
                for k in plan["kernels"]:
                    ops = ", ".join(op["op"] for op in k["absorbed"])
                    fusion = f" ({k['fusion']})" if k["fusion"] else ""
                    print(f"      kernel {k['kernel']}: {k['algorithm']}{fusion}: {ops}")
    ours, xnn = results["RustConv + XNNPACK"], results["XNNPACK alone"]
    print(f"  speed-up over XNNPACK alone: {xnn / ours:.2f}x")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runner", type=Path, required=True)
    parser.add_argument("--iter", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)

    lfm2 = Lfm2ShortConvHF(1024).eval()
    ssm = DiagonalSSM(2048).eval()
    ok = demo_block("lfm2_short_conv", lfm2, lfm2.make_inputs(seq=2048), args)
    ok &= demo_block("diagonal_ssm", ssm, ssm.make_inputs(seq=2048), args)
    verdict = "match" if ok else "DO NOT match"
    print(f"all outputs {verdict} PyTorch eager within {TOLERANCE:.0e}")
    print(
        f"`python -m rustconv.inspect {args.out / 'lfm2_short_conv' / 'ours.pte'}` shows the plan"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
