"""Reading RustConv's profiling events from an ETDump:
moved to :mod:`rustconv.devtools.trace`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.devtools.trace import *  # noqa: F403
from rustconv.devtools.trace import __all__  # noqa: F401
