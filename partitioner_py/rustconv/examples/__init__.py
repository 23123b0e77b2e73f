"""Example models: :mod:`.blocks`, the conv and scan blocks the demo, the
tests and the benchmark export (``rustconv.blocks`` re-exports it)."""
