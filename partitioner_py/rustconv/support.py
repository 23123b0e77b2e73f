"""Which nodes RustConv can run:
moved to :mod:`rustconv.export.support`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.export.support import *  # noqa: F403
from rustconv.export.support import __all__  # noqa: F401
