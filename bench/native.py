"""Builds and loads bench/native/scan.c: the plain C scan baseline, its float64
twin (an accuracy reference) and the memory copy bandwidth probe.

The library is compiled once per (source, compiler) into the cache dir with
``cc -O3 -march=native -fopenmp -shared -fPIC`` and called through ctypes on
contiguous numpy arrays. The thread count is passed to every call.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent / "native" / "scan.c"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]

_F32P = np.ctypeslib.ndpointer(dtype=np.float32, flags="C_CONTIGUOUS")
_F64P = np.ctypeslib.ndpointer(dtype=np.float64, flags="C_CONTIGUOUS")


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc) found for the native baselines")
    return cc


def build(cache_dir: Path) -> Path:
    """Compiles the library unless a build of this source by this compiler exists."""
    cc = _compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + version.encode() + " ".join(CFLAGS).encode())
    lib = cache_dir / "native" / f"libbench_native-{key.hexdigest()[:16]}.so"
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        run = subprocess.run(
            [cc, *CFLAGS, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True
        )
        if run.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed: {run.stderr.strip()[-500:]}")
        tmp.replace(lib)
    return lib


class Native:
    """The loaded library, with numpy-friendly wrappers."""

    def __init__(self, cache_dir: Path):
        self.path = build(cache_dir)
        self._lib = ctypes.CDLL(str(self.path))
        i64, c_int = ctypes.c_int64, ctypes.c_int
        self._lib.bench_linear_scan.argtypes = [_F32P, _F32P, _F32P, _F32P, i64, i64, c_int]
        self._lib.bench_linear_scan.restype = None
        self._lib.bench_linear_scan_f64.argtypes = [_F32P, _F32P, _F32P, _F64P, i64, i64, c_int]
        self._lib.bench_linear_scan_f64.restype = None
        self._lib.bench_copy_seconds.argtypes = [i64, c_int, c_int]
        self._lib.bench_copy_seconds.restype = ctypes.c_double

    @staticmethod
    def _shapes(x0: np.ndarray, a: np.ndarray, u: np.ndarray) -> tuple[int, int]:
        if a.shape != u.shape or a.ndim != 3 or a.shape[0] != 1 or x0.shape != a.shape[:2]:
            raise ValueError(f"scan expects x0 [1,C], a and u [1,C,N]; got {x0.shape}, {a.shape}")
        return a.shape[1], a.shape[2]

    def linear_scan(self, x0, a, u, out: np.ndarray, threads: int) -> np.ndarray:
        """y[t] = a[t]*y[t-1] + u[t] into ``out`` (float32, the shape of ``a``)."""
        channels, n = self._shapes(x0, a, u)
        self._lib.bench_linear_scan(x0, a, u, out, channels, n, threads)
        return out

    def linear_scan_f64(self, x0, a, u, threads: int) -> np.ndarray:
        channels, n = self._shapes(x0, a, u)
        out = np.empty(a.shape, dtype=np.float64)
        self._lib.bench_linear_scan_f64(x0, a, u, out, channels, n, threads)
        return out

    def copy_bandwidth(self, mib: int, threads: int, repeats: int = 5) -> float:
        """Best-of-``repeats`` copy bandwidth in bytes/s over a ``mib`` MiB
        buffer, counting each byte read and each byte written (2x the size)."""
        size = mib << 20
        seconds = self._lib.bench_copy_seconds(size, threads, repeats)
        if seconds <= 0:
            raise RuntimeError(f"copy bandwidth probe could not allocate 2 x {mib} MiB")
        return 2 * size / seconds
