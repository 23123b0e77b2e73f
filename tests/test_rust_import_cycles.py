"""scripts/import_cycles.py: it finds circles between Rust modules, through
``use`` trees, ``super::`` and paths written in code, and ignores comments
and strings; and delegate/src and pte_runner/src have none (issue 17)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/import_cycles.py"


def _module():
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _crate(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _circles(src: Path) -> list[list[str]]:
    ic = _module()
    crate = ic.Crate(src)
    return [[crate.name(m) for m in c] for c in ic.elementary_cycles(crate.edges)]


def test_a_circle_through_use_trees_super_and_code_paths_is_found(tmp_path):
    src = _crate(
        tmp_path,
        {
            "lib.rs": "mod a;\nmod b;\nmod c;\n",
            "a.rs": "use crate::{b::{self, B}, c};\n",
            # Through an inline child module's super::super::, re-exported.
            "b.rs": "mod inner {\n    pub fn f() { super::super::c::g(); }\n}\npub use inner::f;\n",
            "c.rs": "pub fn g() -> u8 { let x: crate::a::A = 0; x }\n",
        },
    )
    assert sorted(_circles(src)) == [
        ["crate::a", "crate::b", "crate::b::inner", "crate::c"],
        ["crate::a", "crate::c"],
    ]


def test_comments_strings_and_external_paths_are_not_references(tmp_path):
    src = _crate(
        tmp_path,
        {
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::f;\nfn g() { f() }\n",
            "b.rs": (
                "/// See [`crate::a::g`].\n// crate::a::g\n/* crate::a /* nested */ */\n"
                'pub fn f() { let _ = "crate::a::g"; let _ = r#"crate::a"#; '
                "let _: &'static str = std::any::type_name::<u8>(); let _ = 'a'; }\n"
            ),
        },
    )
    assert _circles(src) == []


def test_the_script_fails_on_a_circle_and_passes_without(tmp_path):
    bad = _crate(
        tmp_path / "bad",
        {"lib.rs": "mod a;\nmod b;\n", "a.rs": "use super::b::X;\n", "b.rs": "use crate::a::Y;\n"},
    )
    run = subprocess.run([sys.executable, SCRIPT, bad], capture_output=True, text=True)
    assert run.returncode == 1
    assert "circle: crate::a -> crate::b -> crate::a" in run.stdout
    assert "1 import circles" in run.stdout


def test_the_delegate_and_pte_runner_have_no_import_circle():
    crates = [ROOT / "delegate/src", ROOT / "pte_runner/src"]
    run = subprocess.run([sys.executable, SCRIPT, *crates], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    assert run.stdout.count(" 0 import circles") == 2, run.stdout
