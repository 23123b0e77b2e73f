#!/usr/bin/env bash
# The main job: set up, export a small conv + scan model through
# RustConvPartitioner, run it in pte_runner and check it against PyTorch eager.
source "$(dirname "$0")/common.sh"
ensure_venv
build_all
out="${1:-$ROOT/out/demo}"
mkdir -p "$out"
"$RUSTCONV_PYTHON" "$ROOT/scripts/demo.py" --out "$out" --runner "$PTE_RUNNER"
