"""Token-by-token generation with an LFM2-like model through ExecuTorch.

Exports :class:`rustconv.examples.blocks.Lfm2LikeLM` (random weights: short-conv
layers to RustConv, whose conv states the delegate owns, attention and
linears to XNNPACK) with one method for any length, then runs a greedy loop
(a prompt, then one token per call) in ``executorch.runtime``, checks the
tokens against eager and prints the per-token latency. Usage::

    PYTHONPATH=partitioner_py .venv/bin/python scripts/generate.py [--dim 256] [--tokens 32]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import rustconv.runtime  # noqa: F401  (registers RustConvBackend)
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
from executorch.runtime import Runtime
from rustconv import RustConvPartitioner, blocks
from torch.export import export


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", default="ccacca", help="c: short conv, a: attention")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    window = args.prompt + args.tokens + 1
    model = blocks.Lfm2LikeLM(vocab=256, dim=args.dim, layers=args.layers, window=window).eval()
    ep = export(copy.deepcopy(model), model.make_inputs(8), dynamic_shapes=model.dynamic_shapes())
    edge = to_edge_transform_and_lower(
        ep, partitioner=[RustConvPartitioner(), XnnpackPartitioner()]
    )
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(model.mutable_buffers())])
    pte = Path(tempfile.mkdtemp()) / "lfm2_like.pte"
    pte.write_bytes(edge.to_executorch(config).buffer)
    method = Runtime.get().load_program(str(pte)).load_method("forward")

    times: list[float] = []

    def step(tokens: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = method.execute([tokens])[0]
        times.append(time.perf_counter() - start)
        return out

    prompt = model.make_inputs(args.prompt, seed=1)[0]
    tokens, _ = blocks.generate(step, prompt, args.tokens)
    with torch.no_grad():
        want, _ = blocks.generate(copy.deepcopy(model), prompt, args.tokens)
    decode = sorted(times[1:])
    print(f"generated: {tokens}")
    print(f"matches eager: {tokens == want}")
    print(
        f"prefill ({args.prompt} tokens): {times[0] * 1e3:.2f} ms; "
        f"decode p50 {decode[len(decode) // 2] * 1e3:.3f} ms per token"
    )


if __name__ == "__main__":
    main()
