"""Developer tools around a lowered program.

:mod:`.inspect` (``python -m rustconv.inspect``: the runtime's plan),
:mod:`.trace` (RustConv's events in an ETDump), :mod:`.profile`
(``python -m rustconv.profile``: time per fused kernel), :mod:`.pte_runner`
(the one driver of ``pte_runner``, which the benchmark uses too),
:mod:`.testing` (``check_others_unchanged``: RustConv beside other
partitioners) and :mod:`.reference` (the blob interpreter the tests compare
against). Profile-guided partitioning, built on these and on the
partitioner, is :mod:`rustconv.guided`.
"""
