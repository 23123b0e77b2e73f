"""The partitioner:
moved to :mod:`rustconv.export.partitioner`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.export.partitioner import *  # noqa: F403
from rustconv.export.partitioner import __all__  # noqa: F401
