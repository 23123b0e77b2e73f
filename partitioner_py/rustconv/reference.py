"""The blob interpreter:
moved to :mod:`rustconv.devtools.reference`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.devtools.reference import *  # noqa: F403
from rustconv.devtools.reference import __all__  # noqa: F401
