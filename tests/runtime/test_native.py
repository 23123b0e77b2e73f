"""The executorch version record (rustconv.native) and the packaging pins."""

import re
import tomllib
from pathlib import Path

import pytest
from rustconv import native

ROOT = Path(__file__).resolve().parents[2]


def _fake_library(tmp_path, version: str) -> Path:
    path = tmp_path / "librustconv_backend.so"
    path.write_bytes(
        b"\x7fELF junk " + f"RUSTCONV_BUILT_FOR_EXECUTORCH={version}\0".encode() + b"x"
    )
    return path


def test_the_built_library_records_the_installed_executorch():
    library = ROOT / "target" / "release" / native.LIB_NAME
    assert native.built_for(library) == native.installed_executorch()
    native.check_executorch(library)


def test_another_executorch_is_refused_naming_both(tmp_path):
    library = _fake_library(tmp_path, "0.9.0")
    assert native.built_for(library) == "0.9.0"
    with pytest.raises(ImportError, match=r"built for executorch 0\.9\.0, but executorch 1\."):
        native.check_executorch(library)


def test_a_local_build_of_the_same_release_is_accepted(tmp_path):
    native.check_executorch(_fake_library(tmp_path, native.installed_executorch() + "+cpu"))


def test_a_library_without_the_record_is_not_refused(tmp_path):
    path = tmp_path / "old.so"
    path.write_bytes(b"\x7fELF nothing here")
    assert native.built_for(path) is None
    native.check_executorch(path)


def test_package_pins_match_the_environment_and_cargo():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    cargo = tomllib.loads((ROOT / "delegate/Cargo.toml").read_text())["package"]
    assert project["version"] == cargo["version"]
    pins = dict(
        re.findall(r"^(torch|executorch)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)
    )
    deps = dict(d.split("==") for d in project["dependencies"] if "==" in d)
    assert deps == pins
