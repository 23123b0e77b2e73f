"""The RustConv benchmark tool (see bench/README.md; run scripts/bench.sh)."""
