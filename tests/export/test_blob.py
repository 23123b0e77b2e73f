"""The blob container: header layout, alignment, and validation."""

from __future__ import annotations

import struct

import pytest
from rustconv.export import blob
from rustconv.export.blob import (
    CONSTANT_ALIGNMENT,
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    BlobError,
    deserialize_header,
    pack_constants,
    read_blob,
    serialize_blob,
)
from rustconv.fb.Dim import DimT
from rustconv.fb.Graph import Graph, GraphT
from rustconv.fb.Value import ValueT
from rustconv.fb.ValueKind import ValueKind


def test_module_constants():
    assert (MAGIC, LAYOUT_VERSION, HEADER_SIZE, CONSTANT_ALIGNMENT) == (
        b"RCNV",
        1,
        48,
        64,
    )


def _graph(constant_sizes):
    graph = GraphT()
    graph.values, graph.inputs, graph.outputs, graph.nodes = [], [], [], []
    _, offsets = pack_constants([b"\0" * n for n in constant_sizes])
    for i, (size, offset) in enumerate(zip(constant_sizes, offsets, strict=True)):
        value = ValueT()
        value.name = f"c{i}"
        dim = DimT()
        dim.size = size // 4
        value.dims = [dim]
        value.kind = ValueKind.Constant
        value.constantOffset, value.constantSize = offset, size
        graph.values.append(value)
    return graph


def test_pack_constants_aligns_every_constant():
    segment, offsets = pack_constants([b"a" * 5, b"b" * 64, b"", b"c" * 3])
    assert offsets == [0, 64, 128, 128]
    assert all(o % CONSTANT_ALIGNMENT == 0 for o in offsets)
    assert len(segment) == 131  # exact: no trailing padding
    assert segment[64:128] == b"b" * 64 and segment[128:] == b"ccc"
    assert segment[5:64] == b"\0" * 59


def test_header_layout_round_trip():
    constants = [bytes(range(12)), bytes(range(100))]
    data = serialize_blob(_graph([12, 100]), constants)

    magic, version, header_size, flags, fb_off, fb_size, seg_off, seg_size = struct.unpack_from(
        "<4sIIIQQQQ", data
    )
    assert (magic, version, header_size, flags, fb_off) == (b"RCNV", 1, 48, 0, 48)
    assert seg_off % 64 == 0 and seg_off >= fb_off + fb_size
    assert seg_off + seg_size == len(data)
    assert data[fb_off + fb_size : seg_off] == b"\0" * (seg_off - fb_off - fb_size)
    assert data[fb_off + 4 : fb_off + 8] == b"RCG1"

    header = deserialize_header(data)
    assert header.flatbuffer_size == fb_size and header.segment_size == seg_size
    parsed = read_blob(data)
    assert Graph.GraphBufferHasIdentifier(parsed.flatbuffer, 0)
    assert parsed.graph.ValuesLength() == 2
    for i, payload in enumerate(constants):
        value = parsed.graph.Values(i)
        start = value.ConstantOffset()
        assert start % 64 == 0
        assert parsed.segment[start : start + value.ConstantSize()] == payload


def test_blob_without_constants():
    data = serialize_blob(_graph([]), [])
    header = deserialize_header(data)
    assert header.segment_size == 0 and header.segment_offset % 64 == 0
    assert len(data) == header.segment_offset


def test_constant_offsets_must_match_segment():
    graph = _graph([12])
    graph.values[0].constantOffset = 64
    with pytest.raises(BlobError, match="do not match"):
        serialize_blob(graph, [b"\0" * 12])


@pytest.mark.parametrize(
    "offset, fmt, value, match",
    [
        (0, "4s", b"XXXX", "bad magic"),
        (4, "I", 2, "layout version 2"),
        (8, "I", 56, "header size"),
        (12, "I", 1, "flags"),
        (32, "Q", 100, "multiple of 64"),
    ],
)
def test_header_validation(offset, fmt, value, match):
    data = bytearray(serialize_blob(_graph([8]), [b"\0" * 8]))
    struct.pack_into("<" + fmt, data, offset, value)
    with pytest.raises(BlobError, match=match):
        deserialize_header(bytes(data))


def test_truncated_and_corrupt_blobs():
    data = serialize_blob(_graph([8]), [b"\0" * 8])
    with pytest.raises(BlobError, match="shorter than"):
        deserialize_header(data[:20])
    with pytest.raises(BlobError, match="runs past the end"):
        read_blob(data[:-1])
    corrupt = bytearray(data)
    corrupt[HEADER_SIZE + 4 : HEADER_SIZE + 8] = b"XXXX"
    with pytest.raises(BlobError, match="identifier"):
        read_blob(bytes(corrupt))


def test_align_up():
    assert [blob.align_up(n) for n in (0, 1, 63, 64, 65)] == [0, 64, 64, 64, 128]
