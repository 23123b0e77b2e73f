"""The ``rustconv::linear_scan`` custom operator.

A first-order linear recurrence (the core of diagonal state-space models) has no
ATen equivalent that survives export as one node, so it is declared here as a
custom op. ``torch.export`` then keeps it as a single
``torch.ops.rustconv.linear_scan.default`` node, which the RustConv partitioner
delegates and the Rust runtime implements.

A scan left outside the delegate (a program lowered with XNNPACK alone, an
fp64 scan, which RustConv does not delegate, or a scan another partitioner
leaves out) runs as an ordinary ExecuTorch operator instead. For that,
``to_executorch()`` needs an out variant, declared here too::

    rustconv::linear_scan.out(Tensor x0, Tensor a, Tensor u, *, Tensor(a!) out) -> Tensor(a!)

``to_executorch()`` swaps the functional node for it (ExecuTorch pairs the two
by schema, see ``executorch.exir.operator.convert.to_out_variant``), and the
program then calls the kernel registered under ``"rustconv::linear_scan.out"``.
That kernel (``delegate/cpp/scan_kernel.cpp``, a plain scalar loop for
float32, float16, bfloat16 and float64) is linked into both
``librustconv_backend.so``, so ``import rustconv.runtime`` registers it, and
``pte_runner``. The out variant does not change what the RustConv partitioner
delegates: it only ever sees the functional ``linear_scan.default``.

Importing this module registers both overloads; ``import rustconv`` does so.

Semantics, for ``x0 [B, C]`` and ``a, u [B, C, N]``::

    y[..., 0] = a[..., 0] * x0 + u[..., 0]
    y[..., t] = a[..., t] * y[..., t - 1] + u[..., t]

The eager kernel computes in the input dtype, like the runtime does.
"""

from __future__ import annotations

import torch

__all__ = ["linear_scan", "linear_scan_out", "EAGER_DTYPES", "OUT_SCHEMA"]

#: Floating dtypes the eager kernel and the fake kernel accept. The RustConv
#: backend delegates a subset (``rustconv.export.support.SUPPORTED_DTYPES``).
EAGER_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _validate(x0: torch.Tensor, a: torch.Tensor, u: torch.Tensor) -> None:
    """Checks shapes and dtypes; shared by the eager and the fake kernel.

    ``torch._check_with`` is used for the size comparisons so that, under
    ``torch.export`` with a dynamic sequence length, an equality between two
    symbolic sizes becomes a recorded constraint instead of a data-dependent
    guard failure, while a definite mismatch still raises ``ValueError``.
    """
    if x0.dim() != 2:
        raise ValueError(
            f"rustconv.linear_scan: x0 must be 2-D [B, C], got shape {tuple(x0.shape)}"
        )
    if a.dim() != 3:
        raise ValueError(
            f"rustconv.linear_scan: a must be 3-D [B, C, N], got shape {tuple(a.shape)}"
        )
    if u.dim() != 3:
        raise ValueError(
            f"rustconv.linear_scan: u must be 3-D [B, C, N], got shape {tuple(u.shape)}"
        )
    if not (x0.dtype == a.dtype == u.dtype):
        raise TypeError(
            "rustconv.linear_scan: x0, a and u must have the same dtype, got "
            f"{x0.dtype}, {a.dtype}, {u.dtype}"
        )
    if x0.dtype not in EAGER_DTYPES:
        raise TypeError(
            f"rustconv.linear_scan: unsupported dtype {x0.dtype}; expected one of "
            f"{', '.join(str(d) for d in EAGER_DTYPES)}"
        )
    for dim, name in enumerate("BCN"):
        torch._check_with(
            ValueError,
            a.shape[dim] == u.shape[dim],
            lambda name=name: (
                f"rustconv.linear_scan: a and u must have the same shape (they differ "
                f"in {name}), got {tuple(a.shape)} and {tuple(u.shape)}"
            ),
        )
    for dim, name in enumerate("BC"):
        torch._check_with(
            ValueError,
            x0.shape[dim] == a.shape[dim],
            lambda name=name: (
                f"rustconv.linear_scan: x0 must be [B, C] matching a [B, C, N] (they "
                f"differ in {name}), got {tuple(x0.shape)} and {tuple(a.shape)}"
            ),
        )


@torch.library.custom_op("rustconv::linear_scan", mutates_args=())
def linear_scan(x0: torch.Tensor, a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Eager reference kernel: a loop over time, vectorised over ``B`` and ``C``.

    Returns a new contiguous tensor (custom ops may not alias their inputs).
    """
    _validate(x0, a, u)
    y = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    state = x0
    for t in range(a.shape[2]):
        state = torch.addcmul(u[:, :, t], a[:, :, t], state)
        y[:, :, t] = state
    return y


@linear_scan.register_fake
def _linear_scan_fake(x0: torch.Tensor, a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Shape function for export/FakeTensor tracing; works with a symbolic ``N``."""
    _validate(x0, a, u)
    return a.new_empty(a.shape)


#: Schema of the out variant that ``to_executorch()`` substitutes for a scan
#: left outside any delegate. Argument names and types must match the
#: functional op's, or ExecuTorch does not pair the two.
OUT_SCHEMA = "linear_scan.out(Tensor x0, Tensor a, Tensor u, *, Tensor(a!) out) -> Tensor(a!)"

# A fragment of the ``rustconv`` namespace that ``custom_op`` above created.
_lib = torch.library.Library("rustconv", "FRAGMENT")
_lib.define(OUT_SCHEMA)


def _check_out(a: torch.Tensor, out: torch.Tensor) -> None:
    if out.dtype != a.dtype:
        raise TypeError(
            f"rustconv.linear_scan.out: out must have the dtype of a ({a.dtype}), got {out.dtype}"
        )
    if out.device != a.device:
        raise ValueError(
            f"rustconv.linear_scan.out: out must be on the device of a ({a.device}), "
            f"got {out.device}"
        )


@torch.library.impl(_lib, "linear_scan.out", "CompositeExplicitAutograd")
def linear_scan_out(
    x0: torch.Tensor, a: torch.Tensor, u: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    """Eager out variant: the functional kernel's result, written into ``out``.

    ``out`` is resized to ``a``'s shape (like the runtime kernel does) and
    must have ``a``'s dtype. Returns ``out``.
    """
    _check_out(a, out)
    result = torch.ops.rustconv.linear_scan.default(x0, a, u)
    if out.shape != result.shape:
        out.resize_(result.shape)
    out.copy_(result)
    return out


@torch.library.register_fake("rustconv::linear_scan.out", lib=_lib)
def _linear_scan_out_fake(
    x0: torch.Tensor, a: torch.Tensor, u: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    """Fake/meta kernel of the out variant: checks the arguments, returns ``out``."""
    _validate(x0, a, u)
    _check_out(a, out)
    return out
