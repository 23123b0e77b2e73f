#!/usr/bin/env bash
# The main job: set up, lower two real blocks (LFM2's gated short conv, a
# diagonal SSM) with RustConvPartitioner and with XNNPACK alone, run them in
# pte_runner, check them against PyTorch eager and show what was fused.
source "$(dirname "$0")/common.sh"
ensure_venv
build_all
out="${1:-$ROOT/out/demo}"
mkdir -p "$out"
"$RUSTCONV_PYTHON" "$ROOT/scripts/demo.py" --out "$out" --runner "$PTE_RUNNER"
