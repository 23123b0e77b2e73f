#!/usr/bin/env bash
# Sets up and runs every check and test: schema freshness, formatting, lints,
# Rust unit tests, and the Python partitioner and end-to-end tests.
source "$(dirname "$0")/common.sh"
ensure_venv
ensure_ruff
cd "$ROOT"

log "schema bindings"
"$ROOT/scripts/gen_schema.sh" --check

log "formatting and lints"
cargo fmt --all --check
"$RUFF" format --check partitioner_py tests scripts bench
"$RUFF" check partitioner_py tests scripts bench
cargo clippy --release --workspace --all-targets --quiet -- -D warnings

build_all

log "Rust tests"
cargo test --release --workspace --quiet

log "Python tests"
"$RUSTCONV_PYTHON" -m pytest -q partitioner_py/tests tests bench "$@"
