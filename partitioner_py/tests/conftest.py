"""Puts ``partitioner_py/`` on ``sys.path`` so the suite runs from the source tree
with plain ``pytest partitioner_py/tests`` (no ``PYTHONPATH`` needed)."""

import sys
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
if str(_PACKAGE_ROOT) not in sys.path:
    sys.path.insert(0, str(_PACKAGE_ROOT))
