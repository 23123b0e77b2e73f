"""``RustConvBackend`` (``preprocess``):
moved to :mod:`rustconv.export.backend`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.export.backend import *  # noqa: F403
from rustconv.export.backend import __all__  # noqa: F401
