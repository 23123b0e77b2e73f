#!/usr/bin/env bash
# Sets up and runs every check and test: schema freshness, formatting, lints,
# Rust unit tests (also the kernels on aarch64 under QEMU, so NEON code runs),
# and the Python partitioner and end-to-end tests.
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

if [ "${RUSTCONV_SKIP_AARCH64:-0}" = 1 ]; then
    log "aarch64 kernel tests SKIPPED (RUSTCONV_SKIP_AARCH64=1)"
elif ! ensure_aarch64; then
    log "aarch64 kernel tests SKIPPED: their toolchain could not be installed (see above)"
else
    log "kernels on aarch64 (NEON), under QEMU"
    cargo clippy --release -p rustconv-kernels --all-targets --target "$AARCH64" --quiet -- -D warnings
    cargo test --release -p rustconv-kernels --target "$AARCH64" --quiet
fi

log "Python tests"
"$RUSTCONV_PYTHON" -m pytest -q partitioner_py/tests tests bench "$@"
