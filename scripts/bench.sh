#!/usr/bin/env bash
# Benchmarks RustConv against XNNPACK, ExecuTorch's CPU kernels, PyTorch eager,
# PyTorch FFT convolution and a plain C scan; writes results.csv, results.json,
# summary.md and plots to out/bench/<timestamp>/ (or --out DIR).
#
#   scripts/bench.sh [--quick|--full] [--threads N] [--out DIR] [filters...]
#
# --quick (the default) takes under 2 minutes on 2 cores; --full is the whole
# matrix. Filters: conv | scan | C=512,2048 | N=1024 | K=4,N | alt=ours,xnnpack.
# `scripts/bench.sh --help` lists every option.
source "$(dirname "$0")/common.sh"
ensure_venv
build_all
cd "$ROOT"
exec "$RUSTCONV_PYTHON" "$ROOT/bench/run.py" --runner "$PTE_RUNNER" "$@"
