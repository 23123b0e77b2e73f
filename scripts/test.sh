#!/usr/bin/env bash
# Sets up and runs every check and test: schema freshness, formatting, lints,
# Rust unit tests (also the kernels on aarch64 under QEMU, so NEON code runs),
# the wheel (built, installed into a throwaway environment, smoke-tested from
# outside the checkout), the delegate and pte_runner built for aarch64, and
# the Python partitioner and end-to-end tests (the aarch64 runner's under QEMU).
source "$(dirname "$0")/common.sh"
ensure_venv
ensure_ruff
cd "$ROOT"

log "schema bindings"
"$ROOT/scripts/gen_schema.sh" --check

log "formatting and lints"
cargo fmt --all --check
"$RUFF" format --check partitioner_py tests scripts bench setup.py
"$RUFF" check partitioner_py tests scripts bench setup.py
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
# No two modules of the delegate, of pte_runner or of the kernels import each other in a
# loop (issue 17).
"$RUSTCONV_PYTHON" "$ROOT/scripts/import_cycles.py" delegate/src pte_runner/src kernels/src

build_all

log "Rust tests (with fuzz/: every corpus file replayed through its fuzz target)"
# On a rayon pool of 6 threads, wider than CI's 2 cores: tasks then run on thread indices a
# 2-thread pool never uses, so a test whose scratch is sized for fewer threads than its pool
# fails here, as four did on a 16-core machine only.
RAYON_NUM_THREADS=6 cargo test --release --workspace --quiet

if [ "${RUSTCONV_SKIP_AARCH64:-0}" = 1 ]; then
    log "aarch64 kernel tests SKIPPED (RUSTCONV_SKIP_AARCH64=1)"
elif ! ensure_aarch64; then
    log "aarch64 kernel tests SKIPPED: their toolchain could not be installed (see above)"
else
    log "kernels on aarch64 (NEON), under QEMU"
    cargo clippy --release -p rustconv-kernels --all-targets --target "$AARCH64" --quiet -- -D warnings
    # Under emulation the largest grids take every third case (test_support.rs).
    RUSTCONV_TESTS_EMULATED=1 cargo test --release -p rustconv-kernels --target "$AARCH64" --quiet
    log "delegate, pte_runner and wheel for aarch64 (scripts/build_aarch64.sh)"
    status=0
    built=$("$ROOT/scripts/build_aarch64.sh" "$ROOT/out/wheels") || status=$?
    if [ "$status" = 3 ]; then
        log "aarch64 end-to-end tests SKIPPED: the cross build's inputs could not be had (see above)"
    elif [ "$status" != 0 ]; then
        exit "$status"
    else
        # Its KEY=VALUE lines, as RUSTCONV_AARCH64_* for tests/test_aarch64.py.
        while IFS='=' read -r key value; do
            case $key in AARCH64_*) export "RUSTCONV_$key=$value" ;; esac
        done <<<"$built"
        # The delegate and pte_runner have no code of their own per
        # architecture (checked here), so the native clippy above has linted
        # all of it; only where that changes do they need clippy for aarch64.
        if grep -rqE 'target_arch|target_feature' delegate/src pte_runner/src; then
            RUSTCONV_EXECUTORCH_DIR=$RUSTCONV_AARCH64_EXECUTORCH_DIR CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++ \
                cargo clippy --release --quiet -p rustconv-backend -p rustconv-pte-runner --target "$AARCH64" -- -D warnings
        fi
    fi
fi

log "wheel: build, install into a throwaway environment, smoke test outside the checkout"
ensure_build_tools
wheel_tmp=$(mktemp -d)
trap 'rm -rf "$wheel_tmp"' EXIT
PYTHONPATH="$BUILD_TOOLS_DIR" build_wheel "$wheel_tmp/dist" "$RUSTCONV_PYTHON"
layered_venv "$wheel_tmp/env"
# Without the checkout's PYTHONPATH, where the build left rustconv's egg-info.
env -u PYTHONPATH "$wheel_tmp/env/bin/python" -m pip install --quiet --no-index "$wheel_tmp"/dist/rustconv-*.whl
cp "$ROOT/tests/wheel_smoke.py" "$wheel_tmp/"
(cd "$wheel_tmp" && env -u PYTHONPATH -u RUSTCONV_BACKEND_LIB -u PTE_RUNNER \
    "$wheel_tmp/env/bin/python" wheel_smoke.py "$wheel_tmp")
ls -l "$wheel_tmp"/dist/rustconv-*.whl | awk '{print "wheel: " $NF ", " $5 " bytes"}' >&2

log "Python tests"
# Two workers: most of the end-to-end tests' time is single-threaded export;
# a group (one zoo model, the LFM2 recipes) stays in one worker, which lowers it once.
"$RUSTCONV_PYTHON" -m pytest -q -n 2 --dist loadgroup --durations=15 tests bench "$@"
