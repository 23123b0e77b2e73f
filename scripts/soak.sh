#!/usr/bin/env bash
# Soak (README, Tests): long pte_runner runs of the benchmark's block,
# decode and zoo programs, resident memory sampled and every iteration's
# outputs checked against the first's; fails if memory grows after warm-up
# or an output differs.
#
#   scripts/soak.sh [SECONDS] [--threads N] [--group "bench filters"]... [--pte FILE]
#
# SECONDS (default 600) is shared equally between the programs. The first
# run lowers them into bench's cache (out/bench/cache; a few minutes), later
# runs reuse it. scripts/soak.py says what it checks and how
# (`scripts/soak.sh --help`); the report goes to out/soak/<time>/report.json.
# Not part of scripts/test.sh (tests/test_soak.py runs its logic for seconds).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/common.sh"
ensure_venv
build_all
cd "$ROOT"
exec "$RUSTCONV_PYTHON" scripts/soak.py --runner "$PTE_RUNNER" "$@"
