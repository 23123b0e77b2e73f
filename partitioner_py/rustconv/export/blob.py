"""Serialisation of the RustConv delegate blob (see ``schema/README.md``).

Layout::

    [ header (48 bytes) | flatbuffer Graph ("RCG1") | zero padding | constants ]

The header is little-endian:

    ======  =====  ==========================================
    offset  type   field
    ======  =====  ==========================================
    0       4s     magic ``b"RCNV"``
    4       u32    layout version (:data:`LAYOUT_VERSION`)
    8       u32    header size (:data:`HEADER_SIZE`)
    12      u32    flags (0, reserved)
    16      u64    flatbuffer offset (48)
    24      u64    flatbuffer size
    32      u64    constant segment offset (multiple of 64)
    40      u64    constant segment size
    ======  =====  ==========================================

The constant segment starts 64-byte aligned *within the blob*, and every
constant sits at a 64-byte aligned offset inside the segment, so the runtime
can use weights in place when ExecuTorch hands it a suitably aligned buffer.

The writer (:func:`serialize_blob`) is what ``RustConvBackend.preprocess`` uses;
the readers (:func:`deserialize_header`, :func:`read_blob`) exist for tests and
tooling and check every field so a malformed blob fails loudly.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import flatbuffers

from rustconv.fb.Graph import Graph, GraphT

__all__ = [
    "MAGIC",
    "LAYOUT_VERSION",
    "HEADER_SIZE",
    "CONSTANT_ALIGNMENT",
    "FILE_IDENTIFIER",
    "BlobError",
    "BlobHeader",
    "ParsedBlob",
    "align_up",
    "pack_constants",
    "serialize_blob",
    "deserialize_header",
    "read_blob",
]

MAGIC = b"RCNV"
LAYOUT_VERSION = 1
HEADER_SIZE = 48
CONSTANT_ALIGNMENT = 64
#: The flatbuffer file identifier declared in ``rustconv.fbs``.
FILE_IDENTIFIER = b"RCG1"

# magic, version, header size, flags, fb offset, fb size, seg offset, seg size
_HEADER_STRUCT = struct.Struct("<4sIIIQQQQ")
assert _HEADER_STRUCT.size == HEADER_SIZE


class BlobError(ValueError):
    """A blob is malformed, or uses a layout this code does not understand."""


@dataclass(frozen=True)
class BlobHeader:
    """The decoded 48-byte header."""

    magic: bytes
    version: int
    header_size: int
    flags: int
    flatbuffer_offset: int
    flatbuffer_size: int
    segment_offset: int
    segment_size: int

    def pack(self) -> bytes:
        return _HEADER_STRUCT.pack(
            self.magic,
            self.version,
            self.header_size,
            self.flags,
            self.flatbuffer_offset,
            self.flatbuffer_size,
            self.segment_offset,
            self.segment_size,
        )


@dataclass(frozen=True)
class ParsedBlob:
    """A blob split into its parts; ``graph`` is the generated flatbuffer reader."""

    header: BlobHeader
    flatbuffer: bytes
    segment: bytes
    graph: Graph


def align_up(n: int, alignment: int = CONSTANT_ALIGNMENT) -> int:
    """Rounds ``n`` up to a multiple of ``alignment``."""
    return (n + alignment - 1) // alignment * alignment


def pack_constants(constants: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """Lays constants out back to back, each at a 64-byte aligned offset.

    Returns the segment and each constant's offset within it. The segment ends
    right after the last constant (no trailing padding), so its size is exact.
    """
    segment = bytearray()
    offsets = []
    for data in constants:
        segment.extend(b"\0" * (align_up(len(segment)) - len(segment)))
        offsets.append(len(segment))
        segment.extend(data)
    return bytes(segment), offsets


def serialize_blob(graph: GraphT, constants: Sequence[bytes]) -> bytes:
    """Builds a blob from a graph and its constant segment contents.

    ``constants`` are laid out with :func:`pack_constants`; the graph's
    ``Value.constantOffset`` fields must already agree with that layout (the
    backend computes both from the same call). They are checked here, so a
    mismatch is a clear error at export time rather than garbage at runtime.
    """
    segment, offsets = pack_constants(constants)
    _check_constant_offsets(graph, constants, offsets)

    builder = flatbuffers.Builder(1024)
    builder.Finish(graph.Pack(builder), file_identifier=FILE_IDENTIFIER)
    flatbuffer = bytes(builder.Output())

    flatbuffer_offset = HEADER_SIZE
    segment_offset = align_up(flatbuffer_offset + len(flatbuffer))
    header = BlobHeader(
        magic=MAGIC,
        version=LAYOUT_VERSION,
        header_size=HEADER_SIZE,
        flags=0,
        flatbuffer_offset=flatbuffer_offset,
        flatbuffer_size=len(flatbuffer),
        segment_offset=segment_offset,
        segment_size=len(segment),
    )
    padding = b"\0" * (segment_offset - flatbuffer_offset - len(flatbuffer))
    return header.pack() + flatbuffer + padding + segment


def _check_constant_offsets(
    graph: GraphT, constants: Sequence[bytes], offsets: Sequence[int]
) -> None:
    """Every constant payload must be claimed by exactly the Value pointing at it."""
    from rustconv.fb.ValueKind import ValueKind

    claimed = sorted(
        (v.constantOffset, v.constantSize)
        for v in graph.values or []
        if v.kind in (ValueKind.Constant, ValueKind.State)
    )
    expected = sorted(zip(offsets, (len(c) for c in constants), strict=True))
    if claimed != expected:
        raise BlobError(
            "constant Values (offset, size) "
            f"{claimed} do not match the constant segment layout {expected}"
        )


def deserialize_header(blob: bytes) -> BlobHeader:
    """Decodes and validates the header of ``blob``.

    Raises :class:`BlobError` for a wrong magic, an unknown layout version, a
    header size this reader does not know, or regions that fall outside the blob.
    """
    if len(blob) < HEADER_SIZE:
        raise BlobError(f"blob is {len(blob)} bytes, shorter than the {HEADER_SIZE}-byte header")
    header = BlobHeader(*_HEADER_STRUCT.unpack_from(blob, 0))
    if header.magic != MAGIC:
        raise BlobError(f"bad magic {header.magic!r}, expected {MAGIC!r}")
    if header.version != LAYOUT_VERSION:
        raise BlobError(
            f"layout version {header.version} is not supported "
            f"(this reader knows version {LAYOUT_VERSION})"
        )
    if header.header_size != HEADER_SIZE:
        raise BlobError(
            f"header size {header.header_size}, expected {HEADER_SIZE} "
            f"for layout version {LAYOUT_VERSION}"
        )
    if header.flags != 0:
        raise BlobError(f"reserved header flags are {header.flags:#x}, expected 0")
    if header.segment_offset % CONSTANT_ALIGNMENT != 0:
        raise BlobError(
            f"constant segment offset {header.segment_offset} is not a multiple "
            f"of {CONSTANT_ALIGNMENT}"
        )
    return header


def read_blob(blob: bytes) -> ParsedBlob:
    """Splits a whole blob into header, flatbuffer and segment, and checks them."""
    blob = bytes(blob)
    header = deserialize_header(blob)
    fb_start, fb_end = (
        header.flatbuffer_offset,
        header.flatbuffer_offset + header.flatbuffer_size,
    )
    seg_start, seg_end = (
        header.segment_offset,
        header.segment_offset + header.segment_size,
    )
    if fb_start < header.header_size or fb_end > seg_start:
        raise BlobError(
            f"flatbuffer region [{fb_start}, {fb_end}) overlaps the header or "
            f"the constant segment at {seg_start}"
        )
    if seg_end > len(blob):
        raise BlobError(
            f"constant segment [{seg_start}, {seg_end}) runs past the end of the "
            f"{len(blob)}-byte blob"
        )
    flatbuffer = blob[fb_start:fb_end]
    if not Graph.GraphBufferHasIdentifier(flatbuffer, 0):
        raise BlobError(
            f"flatbuffer identifier is {flatbuffer[4:8]!r}, expected {FILE_IDENTIFIER!r}"
        )
    return ParsedBlob(
        header=header,
        flatbuffer=flatbuffer,
        segment=blob[seg_start:seg_end],
        graph=Graph.GetRootAs(flatbuffer, 0),
    )
