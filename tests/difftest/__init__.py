"""Differential testing of RustConv on random models nobody hand-wrote.

Random small models (:mod:`.generate`) are JSON specs (:mod:`.spec`) built
from every op kind the partitioner accepts and some it refuses; each is
exported through both lowering flows, run in ``executorch.runtime`` and
``pte_runner``, and compared with eager in float64 (:mod:`.check`). Every
failure is shrunk to a minimal spec (:mod:`.shrink`, :mod:`.triage`) and kept
in ``regressions/``, which ``tests/test_difftest.py`` replays on every run;
``scripts/fuzz_models.sh`` (:mod:`.fuzz`) is the long run.

It lives under ``tests/`` rather than in the ``rustconv`` package: it is test
machinery (it needs the built backend, ``pte_runner``, XNNPACK and the float64
eager reference), not something a user of the wheel imports, and keeping it
out leaves the wheel and the package's API as they are.
"""
