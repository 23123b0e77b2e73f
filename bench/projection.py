"""Projected time and memory of one call, to skip what would not finish.

Time: each alternative has a work model (direct conv: C*N*K; FFT conv:
C*n*log2(n) with n the FFT size; our backend, which picks its own algorithm:
C*N*min(K, 16*log2(n)); scans: C*N, except the eager scan, a Python loop over
time: N; blocks: the direct definition's flops, each block on its own). A
setting's time is projected from the same alternative's nearest
setting of no larger work already measured (or projected), scaled by the work
ratio; failing that, from the nearest larger measured one; failing that, from
a deliberately rough prior rate. A call projected over ``--time-limit`` is
reported as "DNF (projected X s)" and not run.

Memory: each alternative has a rough peak model (inputs, outputs, weights,
padded/complex buffers, export copies); anything projected over 75% of RAM,
counting what this process already holds, is "skipped: memory".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.workload import Setting

MIB = 1 << 20
MEMORY_FRACTION = 0.75

#: Prior rates, used only before an alternative has any measurement.
PRIOR_DIRECT_FLOPS_PER_THREAD = 0.5e9
PRIOR_FFT_FLOPS_PER_THREAD = 1e9
PRIOR_EAGER_SCAN_STEP_S = 30e-6
PRIOR_STREAM_BYTES_PER_S = 1e9
PRIOR_BLOCK_FLOPS_PER_THREAD = 1e9


def _log2n(s: Setting) -> float:
    return math.log2(max(s.fft_size, 2))


def work(model: str, s: Setting) -> float:
    if model == "block":  # a block: its direct definition's flops
        return float(s.block_flops)
    if model == "direct":
        return float(s.C * s.N * s.K)
    if model == "fft":
        return s.C * s.fft_size * _log2n(s)
    if model == "auto":  # our backend: the better of direct and FFT, roughly
        return s.C * s.N * min(s.K, 16 * _log2n(s))
    if model == "scan_loop":
        return float(s.N)
    if model == "stream":
        return float(s.C * s.N)
    raise ValueError(model)


def prior_seconds(model: str, s: Setting, threads: int) -> float:
    if model == "block":
        return s.block_flops / (PRIOR_BLOCK_FLOPS_PER_THREAD * threads)
    direct = s.direct_flops / (PRIOR_DIRECT_FLOPS_PER_THREAD * threads) if s.K else 0.0
    fft = 8 * s.C * s.fft_size * _log2n(s) / (PRIOR_FFT_FLOPS_PER_THREAD * threads)
    if model == "direct":
        return direct
    if model == "fft":
        return fft
    if model == "auto":
        return min(direct, fft)
    if model == "scan_loop":
        return s.N * PRIOR_EAGER_SCAN_STEP_S
    if model == "stream":
        return s.roofline_bytes / PRIOR_STREAM_BYTES_PER_S
    raise ValueError(model)


@dataclass
class Projection:
    seconds: float
    basis: str  # "measured <setting>", "projected <setting>", "prior", "cost model"

    @property
    def measured(self) -> bool:
        return self.basis.startswith("measured")


class Projector:
    """Remembers each alternative's measured (and projected) one-call times."""

    def __init__(self, threads: int):
        self.threads = threads
        # (alternative, kind or block) -> [(work, seconds, measured, setting name)]
        self._points: dict[tuple[str, str], list[tuple[float, float, bool, str]]] = {}

    def record(self, alt: str, model: str, s: Setting, seconds: float, measured: bool) -> None:
        point = (work(model, s), seconds, measured, s.name)
        self._points.setdefault((alt, s.group), []).append(point)

    def project(self, alt: str, model: str, s: Setting) -> Projection:
        w = work(model, s)
        points = [p for p in self._points.get((alt, s.group), []) if p[0] > 0]
        below = [p for p in points if p[0] <= w]
        if below:
            pw, ps, measured, name = max(below, key=lambda p: (p[0], p[2]))
            kind = "measured" if measured else "projected"
            return Projection(ps * w / pw, f"{kind} {name}")
        above = [p for p in points if p[0] > w and p[2]]
        if above:
            pw, ps, _, name = min(above, key=lambda p: p[0])
            return Projection(ps * w / pw, f"measured {name}")
        return Projection(prior_seconds(model, s, self.threads), "prior")


# Memory ------------------------------------------------------------------------


def export_bytes(s: Setting) -> float:
    """Exporting and serializing holds a few copies of the weights."""
    return 6 * s.weight_bytes + 64 * MIB


def runner_bytes(s: Setting, fft: bool) -> float:
    """pte_runner: inputs read from the npz, the program's weights, planned
    memory for output and intermediates, and FFT buffers when it may use them."""
    spectra = 3 * 8 * s.C * (s.fft_size // 2 + 1) if fft and s.K else 0
    return s.input_bytes + 2 * s.weight_bytes + 2 * s.output_bytes + spectra + 64 * MIB


def eager_conv_bytes(s: Setting) -> float:
    return 4 * s.C * (s.N + s.K - 1) + 2 * s.output_bytes + 2 * s.weight_bytes + 64 * MIB


def torch_fft_bytes(s: Setting) -> float:
    return 3 * 8 * s.C * (s.fft_size // 2 + 1) + 4 * s.C * s.fft_size + s.output_bytes + 64 * MIB


def scan_bytes(s: Setting) -> float:
    return 2 * s.output_bytes + 64 * MIB


def reference_f64_bytes(s: Setting) -> float:
    """The result in float64 plus (conv) block-wise FFT temporaries."""
    return 2 * s.output_bytes + 256 * MIB
