"""Compile-spec keys understood by the RustConv runtime, and their encodings.

ExecuTorch stores each ``CompileSpec`` (a key and raw bytes) in the ``.pte``
next to the delegate blob and hands them to the backend's ``init`` at load time.
This module is the single place that names the keys and fixes their byte
encodings; the Rust runtime decodes the same keys.

Keys:

``num_threads``
    Worker threads for the delegate, a little-endian ``u32``, at least 1 (the
    runtime refuses 0). Without the spec the runtime picks its own default;
    a runtime option or the ``RUSTCONV_NUM_THREADS`` environment variable
    overrides it at load time.

``conv1d_algorithm``
    How the runtime picks each conv1d's algorithm at load time, UTF-8: ``auto``
    (its cost model, the default), ``measure`` (time every applicable algorithm
    once at load and keep the fastest), or one algorithm by name (``direct``,
    ``depthwise_simd``, ``fft``, ``gemm``, ``fft_gemm``), used wherever it applies; other
    convolutions fall back to ``auto``.

``fusion``
    Whether the runtime runs the fused kernels the blob records (one byte:
    1, the default, or 0). With 0, ``preprocess`` gives every blob node its
    own kernel: the same partition, unfused (the benchmark's "ours unfused").
    The runtime may read the key too; the blob already says everything.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from executorch.exir.backend.compile_spec_schema import CompileSpec

__all__ = [
    "NUM_THREADS",
    "KNOWN_KEYS",
    "CompileSpecError",
    "num_threads",
    "decode_num_threads",
    "CONV1D_ALGORITHM",
    "CONV1D_ALGORITHMS",
    "algorithm",
    "decode_algorithm",
    "FUSION",
    "fusion",
    "decode_fusion",
    "fusion_enabled",
    "validate_compile_specs",
]

NUM_THREADS = "num_threads"
CONV1D_ALGORITHM = "conv1d_algorithm"
FUSION = "fusion"

#: Values of ``conv1d_algorithm`` (the runtime's ``Algorithm::name``s plus the
#: two policies).
CONV1D_ALGORITHMS = (
    "auto",
    "measure",
    "direct",
    "depthwise_simd",
    "fft",
    "gemm",
    "fft_gemm",
)

#: Every key this version of the export side knows how to produce.
KNOWN_KEYS = frozenset({NUM_THREADS, CONV1D_ALGORITHM, FUSION})

_U32_MAX = 2**32 - 1


class CompileSpecError(ValueError):
    """A compile spec has an unknown key or a malformed value."""


def num_threads(n: int) -> CompileSpec:
    """Compile spec asking the runtime for ``n`` worker threads (``n >= 1``)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise CompileSpecError(f"num_threads must be an int, got {type(n).__name__}")
    if not 1 <= n <= _U32_MAX:
        raise CompileSpecError(f"num_threads must be in [1, {_U32_MAX}], got {n}")
    return CompileSpec(NUM_THREADS, struct.pack("<I", n))


def decode_num_threads(spec: CompileSpec) -> int:
    """Inverse of :func:`num_threads`, for tests and tooling."""
    if spec.key != NUM_THREADS:
        raise CompileSpecError(f"expected key {NUM_THREADS!r}, got {spec.key!r}")
    if len(spec.value) != 4:
        raise CompileSpecError(
            f"{NUM_THREADS} must be 4 bytes (little-endian u32), got {len(spec.value)}"
        )
    n = struct.unpack("<I", spec.value)[0]
    if n == 0:
        raise CompileSpecError(f"{NUM_THREADS} must be at least 1, got 0")
    return n


def algorithm(name: str) -> CompileSpec:
    """Compile spec choosing how conv1d algorithms are picked (see the module docs)."""
    if name not in CONV1D_ALGORITHMS:
        raise CompileSpecError(
            f"{CONV1D_ALGORITHM} must be one of {', '.join(CONV1D_ALGORITHMS)}; got {name!r}"
        )
    return CompileSpec(CONV1D_ALGORITHM, name.encode())


def decode_algorithm(spec: CompileSpec) -> str:
    """Inverse of :func:`algorithm`, for tests and tooling."""
    if spec.key != CONV1D_ALGORITHM:
        raise CompileSpecError(f"expected key {CONV1D_ALGORITHM!r}, got {spec.key!r}")
    name = bytes(spec.value).decode("utf-8", errors="replace")
    if name not in CONV1D_ALGORITHMS:
        raise CompileSpecError(f"unknown {CONV1D_ALGORITHM} {name!r}")
    return name


def fusion(enabled: bool) -> CompileSpec:
    """Compile spec turning kernel fusion on (the default) or off."""
    if not isinstance(enabled, bool):
        raise CompileSpecError(f"fusion must be a bool, got {type(enabled).__name__}")
    return CompileSpec(FUSION, bytes([int(enabled)]))


def decode_fusion(spec: CompileSpec) -> bool:
    """Inverse of :func:`fusion`, for tests and tooling."""
    if spec.key != FUSION:
        raise CompileSpecError(f"expected key {FUSION!r}, got {spec.key!r}")
    value = bytes(spec.value)
    if value not in (b"\x00", b"\x01"):
        raise CompileSpecError(f"{FUSION} must be one byte, 0 or 1, got {value!r}")
    return value == b"\x01"


def fusion_enabled(specs: Iterable[CompileSpec]) -> bool:
    """The ``fusion`` setting in ``specs`` (validated), True when absent."""
    for spec in specs:
        if spec.key == FUSION:
            return decode_fusion(spec)
    return True


_DECODERS = {
    NUM_THREADS: decode_num_threads,
    CONV1D_ALGORITHM: decode_algorithm,
    FUSION: decode_fusion,
}


def validate_compile_specs(specs: Iterable[CompileSpec]) -> list[CompileSpec]:
    """Checks keys and encodings, so a typo fails at export rather than at load.

    Returns the specs as a list. Duplicate keys are refused because the runtime
    would have to pick one silently.
    """
    result = []
    seen = set()
    for spec in specs:
        if not isinstance(spec, CompileSpec):
            raise CompileSpecError(f"expected executorch CompileSpec, got {type(spec).__name__}")
        if spec.key not in KNOWN_KEYS:
            raise CompileSpecError(
                f"unknown RustConv compile spec {spec.key!r}; known keys: "
                f"{', '.join(sorted(KNOWN_KEYS))}"
            )
        if spec.key in seen:
            raise CompileSpecError(f"compile spec {spec.key!r} given more than once")
        seen.add(spec.key)
        _DECODERS[spec.key](spec)
        result.append(spec)
    return result
