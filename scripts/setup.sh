#!/usr/bin/env bash
# Creates (or reuses) the pinned Python environment and builds everything.
source "$(dirname "$0")/common.sh"
ensure_venv
build_all
log "ready: backend $RUSTCONV_BACKEND_LIB, runner $PTE_RUNNER"
