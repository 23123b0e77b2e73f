#!/usr/bin/env bash
# Runs one fuzz target of fuzz/ under AddressSanitizer for a given time.
#
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
#
# TARGET: init, execute, npz or args (fuzz/src/lib.rs says what each takes).
# Needs rustup's nightly toolchain and cargo-fuzz, which the first run
# installs (`cargo install --locked`) into $CACHE/cargo-fuzz-<version>.
# The checked-in fuzz/corpus/TARGET is read as seeds and never written; the
# inputs the run finds go to fuzz-out/corpus/TARGET, each crash, leak,
# timeout or out-of-memory input to fuzz-out/artifacts/TARGET/. One process,
# one input at a time; libFuzzer flags after SECONDS are passed on (e.g.
# -fork=2 on a machine with cores to spare). Ends with libFuzzer's last
# status line (executions, coverage) and exits non-zero if it found
# anything. A finding, once fixed, is kept as fuzz/corpus/TARGET/<name>
# (README, Tests), so the corpus replay test runs it from then on.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/common.sh"
if [ $# -lt 2 ]; then
    sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
target=$1 seconds=$2
shift 2
case $target in
    init | execute | npz | args) ;;
    *) echo "unknown target '$target' (init, execute, npz or args)" >&2; exit 2 ;;
esac

CARGO_FUZZ_VERSION=0.13.2
CARGO_FUZZ_DIR="$CACHE/cargo-fuzz-$CARGO_FUZZ_VERSION"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    log "installing Rust nightly (cargo-fuzz builds with -Zsanitizer=address)"
    rustup toolchain install nightly --profile minimal
fi
if [ ! -x "$CARGO_FUZZ_DIR/bin/cargo-fuzz" ]; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_FUZZ_DIR"
    cargo install --locked --quiet --root "$CARGO_FUZZ_DIR" cargo-fuzz --version "=$CARGO_FUZZ_VERSION"
fi
PATH="$CARGO_FUZZ_DIR/bin:$PATH"
# The backend's build.rs finds ExecuTorch through the project's Python.
[ -e "$ROOT/.venv/bin/python" ] || ensure_venv

cd "$ROOT"
corpus="fuzz-out/corpus/$target" artifacts="fuzz-out/artifacts/$target"
mkdir -p "$corpus" "$artifacts"
log "fuzzing $target for $seconds s under AddressSanitizer"
# -close_fd_mask=2: the delegate logs every plan it builds to stderr through
# ExecuTorch; libFuzzer and the sanitizer keep a stderr of their own, so
# their reports still come (replay an artifact with
# `cargo test -p rustconv-fuzz --test corpus` after copying it into the
# corpus, or `cargo +nightly fuzz run --features libfuzzer TARGET FILE`,
# to see a panic's message).
# -timeout=10: an input that takes longer is a hang (the slowest seed,
# `measure` timing every algorithm, takes well under a second).
# allocator_may_return_null=1: an allocation a blob asks for that cannot be
# had is an error the delegate returns (`try_reserve`, as in a release build
# where the allocator returns null), not an ASan abort at its 1 TiB cap.
export ASAN_OPTIONS=allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}
status=0
cargo +nightly fuzz run --features libfuzzer --sanitizer address "$target" \
    "$corpus" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -timeout=10 -close_fd_mask=2 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 "$@" || status=$?
exit "$status"
