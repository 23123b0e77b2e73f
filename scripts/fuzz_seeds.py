"""Seed corpora for the fuzz targets in fuzz/ (README, Tests).

    PYTHONPATH=partitioner_py .venv/bin/python scripts/fuzz_seeds.py

Writes, under fuzz/:

* ``corpus/init/seed-*``: every RustConv blob of the programs below (the
  fixture of the previous release, a fixed batch of the differential tests'
  random programs and their kept regressions, lowered as the tests lower
  them), each after the target's option and placement bytes, cycled so every
  ``conv1d_algorithm`` option and both placements occur;
* ``plans/*.blob``: the blobs of ``PLANS``, the valid plans the execute
  target calls (``fuzz/src/execute.rs`` lists them in this order), and
  ``corpus/execute/seed-*``: a call of each at its bounds, two and three;
* ``corpus/npz/seed-*``: small npz files (every dtype pte_runner reads, 0-d,
  empty, compressed, Fortran order, big-endian, names it skips);
* ``corpus/args/seed-*``: pte_runner command lines, arguments separated by NUL.

Old ``seed-*`` files are replaced; anything else in the corpora (a fuzzer's
finding kept as a regression) stays. The same checkout writes the same bytes.
"""

from __future__ import annotations

import argparse
import io
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

#: Programs of the differential tests' generator: (seed, models per program).
DIFFTEST = [(seed, 2) for seed in range(16)]

#: The execute target's plans, by blob name (see ``blobs``); append only, as
#: the target selects a plan by its index here.
PLANS = [
    "v1_causal_conv_scan",  # conv then scan, dynamic length
    "difftest_0",  # stateful (prefill + decode): delegate-owned states
    "difftest_2_0",
    "difftest_2_1",
    "difftest_3",  # static, float32 and float16
    "difftest_5",  # dynamic lengths up to 2048, float32 and float16
    "difftest_10",  # dynamic
    "difftest_15_0",  # stateful, float32 and float16
    "difftest_15_1",
]

#: Algorithm options and placements the init target reads from its first two
#: bytes, cycled over the blobs (fuzz/src/init.rs: options modulo their count,
#: placements below 0x80 aligned).
OPTIONS = range(8)
PLACEMENTS = [0x00, 0x81, 0x00, 0xBF]


def lower(program: dict) -> bytes:
    """The program lowered as the differential tests' ``edge`` flow lowers it."""
    from difftest.spec import DiffModel, dynamic_shapes, example_inputs
    from executorch.exir import to_edge
    from rustconv import RustConvPartitioner
    from torch.export import export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = DiffModel(program).eval()
        ep = export(model, example_inputs(program), dynamic_shapes=dynamic_shapes(program))
        return to_edge(ep).to_backend(RustConvPartitioner()).to_executorch().buffer


def blobs() -> dict[str, bytes]:
    """Every RustConv blob of the seed programs, by a name saying where it came from."""
    from difftest.generate import generate_program
    from difftest.spec import load
    from rustconv.devtools.inspect import delegate_calls

    programs: list[tuple[str, bytes]] = [
        ("v1_causal_conv_scan", (ROOT / "tests/fixtures/v1_causal_conv_scan.pte").read_bytes())
    ]
    sources = [(f"difftest_{seed}", generate_program(seed, graphs=n)) for seed, n in DIFFTEST]
    for path in sorted((ROOT / "tests/difftest/regressions").glob("*.json")):
        sources.append((f"regression_{path.stem}", load(path)["program"]))
    for name, program in sources:
        try:
            programs.append((name, lower(program)))
        except Exception as e:  # noqa: BLE001  (a program that does not lower seeds nothing)
            print(f"{name}: not lowered ({type(e).__name__}: {str(e)[:80]})", file=sys.stderr)
    out = {}
    for name, pte in programs:
        calls = delegate_calls(pte)
        for call in calls:
            out[name if len(calls) == 1 else f"{name}_{call.index}"] = call.blob
    return out


def npz(arrays: dict[str, np.ndarray], compressed: bool = False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def npz_seeds() -> dict[str, bytes]:
    ramp = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    every_dtype = {
        str(i): ramp.astype(t)
        for i, t in enumerate(
            [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
        )
    }
    every_dtype["8"] = ramp > 0.5
    return {
        "every_dtype": npz(every_dtype),
        "compressed": npz({"0": ramp, "1": ramp[:1]}, compressed=True),
        "scalar_and_empty": npz({"0": np.float32(2.5), "1": np.zeros((2, 0, 3), np.float32)}),
        "fortran": npz({"0": np.asfortranarray(ramp)}),
        "big_endian": npz({"0": ramp.astype(">f4")}),
        "other_names": npz({"x": ramp, "07": ramp, "1": ramp.astype(np.float16)}),
        "fixture": (ROOT / "tests/fixtures/v1_causal_conv_scan.npz").read_bytes(),
        "not_a_zip": b"PK\x03\x04" + bytes(26),
        "empty_zip": empty_zip(),
    }


def empty_zip() -> bytes:
    buf = io.BytesIO()
    zipfile.ZipFile(buf, "w").close()
    return buf.getvalue()


ARGS = [
    "-model_path m.pte",
    "-model_path m.pte -iter 5 -warmup 1 -num_threads=2 --etdump_path=e.bin",
    "--model_path=m.pte -inputs_npz_path in.npz -output_npz_path out.npz -seed 3",
    "-model_path m.pte -steps_npz_paths p.npz,t.npz -decode_steps 3 -reset_state",
    "-model_path m.pte -rustconv_threads 1 -method forward_decode -llm_ops off",
    "-model_path m.pte -kernel_lib a.so,b.so --kernel_lib=c.so -llm_ops=on",
    "-help",
    "-model_path m.pte -iter 0",
]


def write(folder: Path, seeds: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("seed-*"):
        old.unlink()
    for name, data in seeds.items():
        (folder / f"seed-{name}").write_bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "fuzz", help="the fuzz crate")
    out = parser.parse_args().out
    found = blobs()
    init = {}
    for i, (name, blob) in enumerate(sorted(found.items())):
        prefix = bytes([OPTIONS[i % len(OPTIONS)], PLACEMENTS[i % len(PLACEMENTS)]])
        init[name] = prefix + blob
    write(out / "corpus/init", init)
    (out / "plans").mkdir(exist_ok=True)
    execute = {}
    for i, name in enumerate(PLANS):
        (out / "plans" / f"{name}.blob").write_bytes(found[name])
        # One call at the bounds; two; three, the first input's first size one under it.
        execute[f"{name}_1"] = bytes([i])
        execute[f"{name}_2"] = bytes([i, 1])
        execute[f"{name}_3"] = bytes([i, 2, 0, 0, 1])
    write(out / "corpus/execute", execute)
    write(out / "corpus/npz", npz_seeds())
    write(out / "corpus/args", {f"{i}": a.replace(" ", "\0").encode() for i, a in enumerate(ARGS)})
    for name, blob in sorted(found.items()):
        print(f"{len(blob):8d}  {name}")


if __name__ == "__main__":
    main()
