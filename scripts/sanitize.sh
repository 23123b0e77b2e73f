#!/usr/bin/env bash
# Runs the Rust tests and pte_runner under sanitizers (README, Tests):
#
#   1. AddressSanitizer: the kernels' and the delegate's Rust tests (and
#      pte_runner's), built with nightly's -Zsanitizer=address and
#      -Zbuild-std (std instrumented too), the C++ shims (delegate/cpp,
#      pte_runner/cpp and cxx's glue) compiled with -fsanitize=address;
#   2. the same ASan pte_runner running the end-to-end tests that drive it
#      (every path of the C++ BackendInterface shim: init, execute, errors);
#   3. UndefinedBehaviorSanitizer on the C++ side: the shims compiled with
#      -fsanitize=undefined (any report aborts), the delegate's and
#      pte_runner's Rust tests and the same end-to-end tests run with them.
#
#   scripts/sanitize.sh            # all three: 10 min on 2 cores with the
#                                  # builds there, about 30 from nothing
#   scripts/sanitize.sh --thread   # ThreadSanitizer instead (below): 5 min
#                                  # with its builds there, about 12 from nothing
#
# --thread: ThreadSanitizer (-Zsanitizer=thread, -Zbuild-std; the C++ shims
# and cxx's glue with -fsanitize=thread) on the delegate's and pte_runner's
# Rust tests, and pte_runner -concurrent through tests/test_concurrency.py:
# methods and loads of one method on threads at once, reset_state from
# another thread. ExecuTorch's libraries are prebuilt, not instrumented:
# TSan sees neither their memory accesses nor their synchronisation. So the
# kernels run on our own rayon pools there (RUSTCONV_THREADPOOL=own), whose
# hand-offs it sees; on ExecuTorch's pthreadpool every task handed to a
# worker is reported as a race with the caller's writes before it (a false
# positive: pthreadpool's futex and atomics order them). What it covers and
# what not: README, Tests. No suppressions. Builds go to target/tsan.
#
# Builds go to target/asan and target/ubsan, beside target/release (which
# the Python side of steps 2 and 3 uses, as scripts/test.sh builds it).
# LeakSanitizer's suppressions, each with its reason: sanitize.lsan.supp.
# -Zbuild-std needs the nightly toolchain's rust-src component, which the
# first run adds with rustup; where rustup cannot install it (no network to
# its server), the script stops and says so. Exits non-zero on any report.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_venv
cd "$ROOT"
HOST=$(rustc -vV | sed -n 's/^host: //p')
START=$SECONDS

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    log "installing Rust nightly (-Zsanitizer and -Zbuild-std are nightly-only)"
    rustup toolchain install nightly --profile minimal ||
        { echo "rustup could not install the nightly toolchain" >&2; exit 1; }
fi
if ! rustup component list --toolchain nightly --installed | grep -qx rust-src; then
    log "adding rust-src to nightly (-Zbuild-std builds an instrumented std from it)"
    rustup component add rust-src --toolchain nightly || {
        echo "rustup could not install rust-src for nightly (is its server, static.rust-lang.org," \
            "reachable?); -Zbuild-std cannot build std without it" >&2
        exit 1
    }
fi
if [ "${1:-}" = "--thread" ]; then
    build_all # target/release: the backend library the tests' Python side loads
    log "ThreadSanitizer: Rust tests of the delegate and pte_runner, pte_runner -concurrent"
    # allocator_may_return_null: tests that ask for more memory than there is
    # (an arena of 2^50 bytes) check that it fails cleanly, as malloc does
    # without a sanitizer; TSan's allocator would abort instead.
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1"
    export RUSTCONV_THREADPOOL=own
    tsan_env=(
        RUSTFLAGS="-Zsanitizer=thread -Cforce-frame-pointers=yes"
        CFLAGS="-fsanitize=thread -fno-omit-frame-pointer"
        CXXFLAGS="-fsanitize=thread -fno-omit-frame-pointer"
        CARGO_TARGET_DIR="$ROOT/target/tsan"
    )
    tsan_args=(-Zbuild-std --target "$HOST" --release --quiet)
    # Skipped: the delegate's tests of ExecuTorch's pool itself, for the
    # false positive above; the arena residency test, as under ASan below.
    env "${tsan_env[@]}" cargo +nightly test "${tsan_args[@]}" \
        -p rustconv-backend -p rustconv-pte-runner --lib --tests \
        -- --skip executorch_pool --skip executorchs_pool --skip not_resident_until_written
    env "${tsan_env[@]}" cargo +nightly build "${tsan_args[@]}" -p rustconv-pte-runner --bin pte_runner
    PTE_RUNNER="$ROOT/target/tsan/$HOST/release/pte_runner" "$RUSTCONV_PYTHON" -m pytest -q \
        -p no:cacheprovider tests/test_concurrency.py
    log "ThreadSanitizer: no reports ($(((SECONDS - START) / 60)) min $(((SECONDS - START) % 60)) s)"
    exit 0
fi
build_all # target/release: the backend library the end-to-end tests' Python side loads

# The end-to-end tests that run pte_runner, with the sanitized runner.
E2E_TESTS="tests/test_pte_runner_and_errors.py tests/test_streaming.py"
e2e() {
    PTE_RUNNER=$1 "$RUSTCONV_PYTHON" -m pytest -q -p no:cacheprovider $E2E_TESTS
}

log "1/3 AddressSanitizer: Rust tests of the kernels, the delegate and pte_runner"
# halt_on_error is ASan's default; detect_leaks: see the suppressions file;
# allocator_may_return_null: as under --thread above (the arena and scratch
# tests ask for up to 2^60 bytes and expect the error a release build gives);
# fast_unwind_on_malloc=0: the prebuilt libraries (libstdc++, ExecuTorch's)
# have no frame pointers, so the fast unwinder stops at `operator new` and
# glibc's dlerror buffer (a failed dlopen of the LLM custom ops) loses the
# frame its suppression names.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:allocator_may_return_null=1:fast_unwind_on_malloc=0"
export LSAN_OPTIONS="suppressions=$ROOT/scripts/sanitize.lsan.supp:print_suppressions=0"
# CFLAGS/CXXFLAGS reach the cc crate, which cxx-build compiles the shims with;
# `--target` keeps RUSTFLAGS off build scripts and proc macros.
asan_env=(
    RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes"
    CFLAGS="-fsanitize=address -fno-omit-frame-pointer"
    CXXFLAGS="-fsanitize=address -fno-omit-frame-pointer"
    CARGO_TARGET_DIR="$ROOT/target/asan"
)
asan_args=(-Zbuild-std --target "$HOST" --release --quiet)
# Skipped: the test that a large arena is not resident until written, a
# property of the system allocator's calloc; ASan's allocator writes the
# zeros itself.
env "${asan_env[@]}" cargo +nightly test "${asan_args[@]}" \
    -p rustconv-kernels -p rustconv-backend -p rustconv-pte-runner --lib --tests \
    -- --skip not_resident_until_written
env "${asan_env[@]}" cargo +nightly build "${asan_args[@]}" -p rustconv-pte-runner --bin pte_runner

log "2/3 AddressSanitizer: pte_runner in the end-to-end tests ($E2E_TESTS)"
e2e "$ROOT/target/asan/$HOST/release/pte_runner"
unset ASAN_OPTIONS LSAN_OPTIONS

log "3/3 UndefinedBehaviorSanitizer on the C++ shims: delegate and pte_runner tests, end-to-end tests"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
# gcc's UBSan runtime, named: rustc links with -nodefaultlibs, so the driver
# would not add it for -fsanitize=undefined.
ubsan_env=(
    CFLAGS="-fsanitize=undefined -fno-sanitize-recover=undefined"
    CXXFLAGS="-fsanitize=undefined -fno-sanitize-recover=undefined"
    RUSTFLAGS="-Clink-arg=-lubsan"
    CARGO_TARGET_DIR="$ROOT/target/ubsan"
)
env "${ubsan_env[@]}" cargo test --release --quiet -p rustconv-backend -p rustconv-pte-runner --lib --tests
env "${ubsan_env[@]}" cargo build --release --quiet -p rustconv-pte-runner --bin pte_runner
e2e "$ROOT/target/ubsan/release/pte_runner"

log "sanitizers: no reports ($(((SECONDS - START) / 60)) min $(((SECONDS - START) % 60)) s)"
