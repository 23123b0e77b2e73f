"""Fetches the executorch wheel for a platform and unpacks what a native
build needs: ``executorch/include``, ``executorch/lib`` and the dist-info
(delegate/build.rs reads the version from it). Prints the unpacked package directory,
for ``RUSTCONV_EXECUTORCH_DIR``.

Used where the build's own Python has no executorch of the right platform:
the wheel build in an isolated environment (setup.py) and the aarch64 cross
build (scripts/build_aarch64.sh). The wheel comes from PyPI through pip
(``--only-binary=:all: --no-deps``: its headers and libraries, never torch)
into the cache, and is never built from source.

    python scripts/executorch_wheel.py --version 1.5.1 [--platform manylinux_2_28_aarch64]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from platform import machine

#: The parts of the wheel a build needs; the rest (Python code, flatc, ...) is left packed.
_MEMBERS = ("executorch/include/", "executorch/lib/")


def cache_dir() -> Path:
    """Where wheels and unpacked packages are kept (as scripts/common.sh)."""
    if os.environ.get("RUSTCONV_CACHE"):
        return Path(os.environ["RUSTCONV_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rustconv"


def fetch(version: str, platform: str | None = None, python: str = "3.11") -> Path:
    """The unpacked executorch package of the wheel for ``platform`` (this
    machine's when None), downloading it on first use."""
    cache = cache_dir()
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    arch = platform.rsplit("_", 1)[-1] if platform else machine()
    abi = "cp" + python.replace(".", "")
    pattern = f"executorch-{version}-{abi}-{abi}-*{arch}.whl"
    if not sorted(wheels.glob(pattern)):
        command = [sys.executable, "-m", "pip", "download", "--quiet", f"executorch=={version}"]
        command += ["--no-deps", "--only-binary=:all:", "--dest", str(wheels)]
        command += ["--python-version", python, "--implementation", "cp"]
        if platform:
            command += ["--platform", platform]
        subprocess.run(command, check=True, stdout=sys.stderr)
    found = sorted(wheels.glob(pattern))
    if not found:
        raise SystemExit(f"no executorch=={version} wheel matching {pattern} in {wheels}")
    wheel = found[-1]
    target = cache / wheel.stem
    package = target / "executorch"
    if not (target / ".complete").exists():
        with zipfile.ZipFile(wheel) as z:
            names = [
                n
                for n in z.namelist()
                if n.startswith(_MEMBERS) or n.split("/")[0].endswith(".dist-info")
            ]
            z.extractall(target, names)
        (target / ".complete").touch()
    return package


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", required=True, help="executorch version, e.g. 1.5.1")
    p.add_argument("--platform", help="pip platform tag, e.g. manylinux_2_28_aarch64")
    p.add_argument("--python", default="3.11", help="Python version of the wheel to fetch")
    args = p.parse_args()
    print(fetch(args.version, args.platform, args.python))


if __name__ == "__main__":
    main()
