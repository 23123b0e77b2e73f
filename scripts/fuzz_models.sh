#!/usr/bin/env bash
# Differential testing on random models, for a given time, in parallel.
#
#   scripts/fuzz_models.sh [--minutes M] [--jobs J] [--seed S] [--out DIR] [--graphs G]
#                          [--shrink-budget SECONDS] [--no-shrink]
#
# Each job checks programs of random models (tests/difftest: generated from
# the seed, exported through both lowering flows, run in executorch.runtime
# and pte_runner, compared with eager), shrinks every failure to a minimal
# spec and writes it under DIR (default fuzz-out/<seed>): failures/ holds
# each failure (spec, error, eager vs delegate numbers), new_regressions/
# the distinct shrunk reproducers, ready for tests/difftest/regressions/.
# Ends with one summary line (models run, failing models, models/s); exits 1
# if any model failed. Jobs run under `nice -n 19`: on a shared machine use
# one job while others build.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/common.sh"
ensure_venv
use_built_backend
args=("$@")
seed=0 out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --seed) seed=$2; shift 2 ;;
        --seed=*) seed=${1#*=}; shift ;;
        --out) out=$2; shift 2 ;;
        --out=*) out=${1#*=}; shift ;;
        *) shift ;;
    esac
done
[ -n "$out" ] || args+=(--out "$ROOT/fuzz-out/$seed")
export PYTHONPATH="$ROOT/tests:$PYTHONPATH"
exec nice -n 19 "$RUSTCONV_PYTHON" -m difftest.fuzz "${args[@]}"
