"""Harness-only speed-ups of ExecuTorch's lowering that leave its result unchanged.

``torch.export``'s ``run_decompositions`` (run several times per
``to_edge_transform_and_lower``: once per partitioner, then the default)
collects every preservable CompositeImplicitAutograd op of every op
namespace each time, walking the whole dispatcher (``_collect_all_valid_cia_ops``;
~15% of lowering a small program). torch does not cache it because a custom
op registered later adds entries. Here it is cached under a key that
changes when that happens (the number of CIA registrations and of op
namespaces), so the answer is the same one torch would compute.
"""

from __future__ import annotations

__all__ = ["install"]

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    import torch
    import torch._export.utils as utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    original = utils._collect_all_valid_cia_ops
    cache: dict[tuple[int, int], set] = {}

    def collect() -> set:
        key = (
            len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")),
            len(torch.ops._dir),
        )
        if key not in cache:
            cache.clear()
            cache[key] = original()
        return cache[key]

    for module in (utils, decomp_utils, exported_program):
        module._collect_all_valid_cia_ops = collect
    _installed = True
