"""The example blocks:
moved to :mod:`rustconv.examples.blocks`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.examples.blocks import *  # noqa: F403
from rustconv.examples.blocks import __all__  # noqa: F401
