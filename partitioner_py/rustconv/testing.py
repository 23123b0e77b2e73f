"""``check_others_unchanged`` (rule one):
moved to :mod:`rustconv.devtools.testing`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.devtools.testing import *  # noqa: F403
from rustconv.devtools.testing import __all__  # noqa: F401
