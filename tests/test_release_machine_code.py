"""What the release library's machine code must keep, which no result or
timing test notices when it goes.

* The fused elementwise loop (``kernels/src/fused/flat.rs``) stays one
  inlined instruction body per instruction set. ``run_block`` calls the
  instruction body at one site, and each op's loops are inlined there. A
  second call site (stop 40's first form of one-pass instructions) made
  every per-ISA variant of ``flat`` about 3.5 times larger (6,578 to 23,357
  instructions for AVX2) and Mimi's decoder 10% slower at one thread on the
  16-core Xeon, while every other test passed.
* No AVX2 masked store (``vmaskmovps``/``vpmaskmovd`` to memory): microcoded
  on AMD Zen 1-3, about one vector per 25 cycles. LLVM emits one for a
  select stored in place (``x = c ? x : y``, a ReLU, a clamp);
  ``fused/ops.rs``'s ``staged`` computes such loops on the stack instead
  (stop 39: a quarter of a Mimi encoder's fused elementwise time). Masked
  loads are cheap and allowed.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Bytes of machine code one variant may take. On 2026-11-28 (x86-64, the
#: release profile): the portable variant 40.6 KB, AVX2 76.7 KB, AVX-512
#: 75.3 KB; the bloated form was about 190 KB.
MAX_BYTES = 120_000
FLAT = re.compile(r"rustconv_kernels::fused::flat::flat(::\w+)?$")


def _library() -> Path:
    lib = os.environ.get("RUSTCONV_BACKEND_LIB")
    path = Path(lib) if lib else ROOT / "target" / "release" / "librustconv_backend.so"
    if not path.is_file():
        pytest.fail(f"backend library not built at {path}: run scripts/setup.sh")
    return path


def flat_variants(library: Path) -> dict[str, int]:
    """Symbol name -> size in bytes of every variant of ``fused::flat::flat``."""
    out = subprocess.run(
        ["nm", "--defined-only", "--print-size", "--demangle", str(library)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    sizes = {}
    for line in out.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and FLAT.match(parts[3]):
            sizes[parts[3]] = int(parts[1], 16)
    return sizes


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is not installed")
def test_each_flat_variant_inlines_its_instruction_body_once():
    library = _library()
    sizes = flat_variants(library)
    # The portable variant and at least one per-ISA one, or the names moved
    # and this test would check nothing.
    assert len(sizes) >= 2, f"no fused::flat::flat variants in {library}: {sorted(sizes)}"
    large = {name: size for name, size in sizes.items() if size > MAX_BYTES}
    assert not large, (
        f"flat variants larger than {MAX_BYTES} bytes: {large} (all: {sizes}); "
        "is run_block's instruction body inlined at more than one site?"
    )


#: An AVX2 masked store in objdump's AT&T syntax: vector registers in, memory out.
MASKED_STORE = re.compile(r"\sv(p)?maskmov\w*\s+%ymm\d+,%ymm\d+,[^%]*\(")


def masked_stores(library: Path) -> list[str]:
    """``function: instruction`` for every AVX2 masked store in ``library``."""
    out = subprocess.run(
        ["objdump", "--disassemble", "--demangle", "--no-show-raw-insn", str(library)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found, function = [], "?"
    for line in out.splitlines():
        if line.endswith(">:"):
            function = line[line.index("<") + 1 : -2]
        elif MASKED_STORE.search(line):
            found.append(f"{function}: {line.strip()}")
    return found


def test_masked_store_pattern_tells_stores_from_loads():
    assert MASKED_STORE.search("  1f00:\tvmaskmovps %ymm1,%ymm0,(%rdi,%rax,4)")
    assert MASKED_STORE.search("  1f00:\tvpmaskmovd %ymm2,%ymm3,0x20(%rsi)")
    assert not MASKED_STORE.search("  1f00:\tvmaskmovps (%r8,%rdx,4),%ymm4,%ymm4")


@pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump is not installed")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="AVX2 is x86-64's")
def test_no_avx2_masked_stores():
    stores = masked_stores(_library())
    assert not stores, f"AVX2 masked stores (slow on AMD Zen 1-3; see ops::staged): {stores}"
