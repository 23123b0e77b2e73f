"""XNNPACK's ``preprocess`` remembered by content, for the test run.

XNNPACK's ``preprocess`` re-traces each partition through its passes, about
1.5 s a partition on the 2-core machine: ExecuTorch's q8da4w LFM2 recipe has
40, a small transformers LFM2 15. The tests lower the same model more than
once (with and without RustConv, rule one's "absent" lowering, the recipe as
shipped beside ours), and most partitions XNNPACK gets are then the same
subgraph again. ``preprocess`` is a function of its inputs, so a partition
whose inputs are equal in every part it can read gets the blob computed the
first time:

* the graph's code, every node's name, op, target, arguments, and every
  ``meta`` entry but the stack trace, the provenance and the partition's
  tag (``val`` shapes, dtypes and strides, ``debug_handle``,
  ``source_fn_stack``, the module paths and types of ``nn_module_stack``);
* the graph signature;
* every parameter, buffer and constant: name, dtype, shape and bytes;
* the compile specs.

Anything else differs, and the key does, and XNNPACK runs. A result is
handed out as a copy, so no caller changes another's. The memo lives in one
test process and keeps the last ``KEEP`` results.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict

import torch

#: Results kept: the repeats come from lowerings of one model, test after test.
KEEP = 256
#: Node meta that says where a node came from, not what it is, and the
#: partition's tag (the same on every node of a partition, numbered per
#: lowering).
_PROVENANCE = frozenset({"stack_trace", "from_node", "seq_nr", "delegation_tag"})


def _described(value):
    """A tensor by its shape, dtype and strides (a fake tensor's repr has
    neither dtype float32 nor strides); containers recursively."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.stride())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_described(v) for v in value])
    if isinstance(value, dict):
        return {k: _described(v) for k, v in value.items()}
    return value


def fingerprint(edge_program, compile_specs) -> str:
    h = hashlib.sha256()
    h.update(edge_program.graph_module.code.encode())
    for node in edge_program.graph.nodes:
        meta = {k: _described(v) for k, v in node.meta.items() if k not in _PROVENANCE}
        if "nn_module_stack" in meta:
            # Keyed by the ids of the module objects, new with each build of
            # the model; the paths and types are what it says.
            meta["nn_module_stack"] = list(meta["nn_module_stack"].values())
        h.update(
            repr((node.name, node.op, str(node.target), node.args, node.kwargs, meta)).encode()
        )
    h.update(repr(edge_program.graph_signature).encode())
    tensors = {**edge_program.state_dict, **edge_program.constants}
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, torch.Tensor):
            t = t.detach().contiguous()
            h.update(repr((name, t.dtype, tuple(t.shape))).encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr((name, type(t).__name__, t)).encode())
    for spec in compile_specs:
        h.update(repr((spec.key, bytes(spec.value))).encode())
    return h.hexdigest()


class Memo:
    def __init__(self, preprocess):
        self._preprocess = preprocess
        self._kept: OrderedDict[str, object] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __call__(self, edge_program, compile_specs):
        key = fingerprint(edge_program, compile_specs)
        if key in self._kept:
            self._kept.move_to_end(key)
            self.hits += 1
            return copy.deepcopy(self._kept[key])
        self.misses += 1
        result = self._preprocess(edge_program, compile_specs)
        self._kept[key] = copy.deepcopy(result)
        if len(self._kept) > KEEP:
            self._kept.popitem(last=False)
        return result


def original_preprocess():
    """XNNPACK's own ``preprocess``, under any memos installed."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    preprocess = XnnpackBackend.__dict__["preprocess"].__func__
    while isinstance(preprocess, Memo):
        preprocess = preprocess._preprocess
    return preprocess


def install():
    """Wraps ``XnnpackBackend.preprocess`` for this process; returns the memo
    and a function that puts the original back."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    original = XnnpackBackend.__dict__["preprocess"]
    memo = Memo(original.__func__)
    XnnpackBackend.preprocess = staticmethod(memo)

    def uninstall():
        XnnpackBackend.preprocess = original

    return memo, uninstall
