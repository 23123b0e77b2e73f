#!/usr/bin/env bash
# Builds the delegate and pte_runner for aarch64-unknown-linux-gnu, and the
# aarch64 wheel: Rust's aarch64 std (rustup), Debian's cross gcc/g++ and arm64
# libc/libstdc++, and ExecuTorch's aarch64 headers and libraries from the
# pinned executorch manylinux aarch64 wheel on PyPI (fetched with pip's
# --platform into the cache, never built from source; its libraries need only
# glibc and libstdc++, no torch).
#
#   scripts/build_aarch64.sh [WHEEL_DIR]     (default out/wheels)
#
# Leaves target/aarch64-unknown-linux-gnu/release/{pte_runner,librustconv_backend.so}
# (RUNPATH: the unpacked aarch64 executorch, for qemu-aarch64 on this machine)
# and the wheel (RUNPATH relative to the installed executorch, for the device).
# Prints `AARCH64_PTE_RUNNER=`, `AARCH64_WHEEL=` and `AARCH64_EXECUTORCH_DIR=`
# lines last (what tests/test_aarch64.py runs). Exits 3, saying why, when the
# toolchain or the executorch wheel cannot be had.
source "$(dirname "$0")/common.sh"
ensure_venv
cd "$ROOT"
wheel_dir=${1:-$ROOT/out/wheels}

ensure_aarch64 || exit 3
ET_AARCH64=$("$RUSTCONV_PYTHON" "$ROOT/scripts/executorch_wheel.py" --version "$(executorch_pin)" \
    --platform manylinux_2_28_aarch64) || {
    echo "the executorch $(executorch_pin) manylinux aarch64 wheel could not be fetched" >&2
    exit 3
}
log "building the delegate and pte_runner for $AARCH64 against $ET_AARCH64"
export RUSTCONV_EXECUTORCH_DIR=$ET_AARCH64
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
cargo build --release --quiet --target "$AARCH64" -p rustconv-backend -p rustconv-pte-runner

log "building the $AARCH64 wheel into $wheel_dir"
ensure_build_tools
PYTHONPATH="$BUILD_TOOLS_DIR" CARGO_BUILD_TARGET=$AARCH64 build_wheel "$wheel_dir" "$RUSTCONV_PYTHON"
wheel=$(ls -t "$wheel_dir"/rustconv-*-linux_aarch64.whl | head -1)
log "aarch64 wheel: $wheel, $(stat -c %s "$wheel") bytes"
echo "AARCH64_PTE_RUNNER=$ROOT/target/$AARCH64/release/pte_runner"
echo "AARCH64_WHEEL=$wheel"
echo "AARCH64_EXECUTORCH_DIR=$ET_AARCH64"
