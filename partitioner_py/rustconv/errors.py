"""Exception types raised by the RustConv export side.

They subclass the built-in types a caller would expect (``ValueError`` for
a graph the backend cannot express), so generic handlers keep working, while
tests and tools can catch the specific kind.
"""

from __future__ import annotations

__all__ = ["RustConvError", "UnsupportedGraphError", "DynamicShapeError"]


class RustConvError(Exception):
    """Base class of every error raised by ``rustconv``."""


class UnsupportedGraphError(RustConvError, ValueError):
    """A subgraph handed to ``RustConvBackend.preprocess`` cannot be lowered."""


class DynamicShapeError(UnsupportedGraphError):
    """A dynamic dimension has no finite upper bound, or its bound cannot be found.

    The runtime plans memory for the largest shape, so every dynamic size must
    be bounded; export with ``torch.export.Dim("seq", max=...)``.
    """
