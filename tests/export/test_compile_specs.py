"""Compile specs: encoding, validation, and pass-through to the delegate."""

from __future__ import annotations

import pytest
from executorch.exir.backend.compile_spec_schema import CompileSpec
from rustconv import RustConvPartitioner
from rustconv.compile_specs import (
    NUM_THREADS,
    CompileSpecError,
    decode_num_threads,
    num_threads,
    validate_compile_specs,
)


def test_num_threads_is_little_endian_u32():
    spec = num_threads(4)
    assert spec.key == NUM_THREADS == "num_threads"
    assert spec.value == b"\x04\x00\x00\x00"
    assert decode_num_threads(num_threads(70000)) == 70000


@pytest.mark.parametrize("bad", [0, -1, 2**32, 1.5, True, "4"])
def test_num_threads_rejects_bad_values(bad):
    with pytest.raises(CompileSpecError):
        num_threads(bad)


def test_validation():
    assert validate_compile_specs([num_threads(2)]) == [num_threads(2)]
    with pytest.raises(CompileSpecError, match="unknown RustConv compile spec"):
        validate_compile_specs([CompileSpec("num_thread", b"\x01\0\0\0")])
    with pytest.raises(CompileSpecError, match="more than once"):
        validate_compile_specs([num_threads(1), num_threads(2)])
    with pytest.raises(CompileSpecError, match="4 bytes"):
        validate_compile_specs([CompileSpec(NUM_THREADS, b"\x01")])
    with pytest.raises(CompileSpecError, match="at least 1"):
        validate_compile_specs([CompileSpec(NUM_THREADS, b"\0\0\0\0")])


def test_partitioner_carries_compile_specs():
    partitioner = RustConvPartitioner(compile_specs=[num_threads(3)])
    assert partitioner.delegation_spec.backend_id == "RustConvBackend"
    assert partitioner.delegation_spec.compile_specs == [num_threads(3)]
    with pytest.raises(CompileSpecError):
        RustConvPartitioner(compile_specs=[CompileSpec("bogus", b"")])


def test_algorithm_spec_round_trips_and_rejects_unknown_names():
    from rustconv.compile_specs import CONV1D_ALGORITHMS, algorithm, decode_algorithm

    for name in CONV1D_ALGORITHMS:
        assert decode_algorithm(algorithm(name)) == name
    with pytest.raises(CompileSpecError, match="must be one of"):
        algorithm("winograd")
    assert validate_compile_specs([algorithm("fft"), num_threads(2)])


def test_fusion_spec_is_one_byte_and_defaults_to_on():
    from rustconv.compile_specs import FUSION, decode_fusion, fusion, fusion_enabled

    assert fusion(True) == CompileSpec(FUSION, b"\x01")
    assert fusion(False).value == b"\x00" and FUSION == "fusion"
    assert decode_fusion(fusion(False)) is False
    assert fusion_enabled([]) is True
    assert fusion_enabled([num_threads(2), fusion(False)]) is False
    assert validate_compile_specs([fusion(True), num_threads(1)])
    with pytest.raises(CompileSpecError, match="bool"):
        fusion(1)
    with pytest.raises(CompileSpecError, match="one byte"):
        validate_compile_specs([CompileSpec(FUSION, b"\x02")])
    with pytest.raises(CompileSpecError, match="more than once"):
        validate_compile_specs([fusion(True), fusion(False)])
