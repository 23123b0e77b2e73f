"""``python -m rustconv.inspect``:
moved to :mod:`rustconv.devtools.inspect`; this path keeps working.

A thin re-export, kept for code written against the package before it was
split by role (export, runtime, devtools, examples; see ``rustconv/__init__.py``).
"""

from rustconv.devtools.inspect import *  # noqa: F403
from rustconv.devtools.inspect import __all__  # noqa: F401

if __name__ == "__main__":
    import sys

    from rustconv.devtools.inspect import main

    sys.exit(main())
