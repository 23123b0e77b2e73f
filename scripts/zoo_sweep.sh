#!/usr/bin/env bash
# The zoo sweep: upstream models with a 1-D convolution beyond the zoo
# (tests/zoo/sweep_models.py, tiny random configurations), each exported,
# lowered with [RustConvPartitioner(), XnnpackPartitioner()], run in
# executorch.runtime and pte_runner, and compared with eager.
#
#   scripts/zoo_sweep.sh [NAME ...] [--out PATH] [--work DIR] [--timeout S]
#
# One line per model (status, RustConv and XNNPACK calls, what RustConv
# leaves outside, time); --out writes the markdown table (docs/bench/zoo-sweep-*.md).
# A failure is classified upstream's when XNNPACK alone fails the same way.
# Minutes for the whole catalogue, so not part of scripts/test.sh. One model
# at a time, each in its own process, under `nice -n 10`. Exits 1 if any
# model is not OK.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/common.sh"
ensure_venv
export RUSTCONV_BACKEND_LIB=${RUSTCONV_BACKEND_LIB:-$ROOT/target/release/librustconv_backend.so}
export PTE_RUNNER=${PTE_RUNNER:-$ROOT/target/release/pte_runner}
for f in "$RUSTCONV_BACKEND_LIB" "$PTE_RUNNER"; do
    [ -f "$f" ] || { echo "missing $f: run cargo build --release" >&2; exit 2; }
done
export PYTHONPATH="$ROOT/tests:$ROOT/tests/zoo:$PYTHONPATH"
exec nice -n 10 "$RUSTCONV_PYTHON" "$ROOT/tests/zoo/sweep.py" "$@"
