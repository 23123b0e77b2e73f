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
use_built_backend
export PYTHONPATH="$ROOT/tests:$ROOT/tests/zoo:$PYTHONPATH"
exec nice -n 10 "$RUSTCONV_PYTHON" "$ROOT/tests/zoo/sweep.py" "$@"
