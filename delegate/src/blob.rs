//! The delegate blob's framing (schema/README.md): a fixed header, the
//! flatbuffer graph and the 64-byte aligned constant segment.

use std::ops::Range;

use crate::error::BlobError;

pub const MAGIC: [u8; 4] = *b"RCNV";
/// The newest layout this runtime reads.
pub const LAYOUT_VERSION: u32 = 1;
pub const HEADER_LEN: usize = 48;
pub const CONSTANT_ALIGNMENT: usize = 64;

/// Where the parts of a blob lie, checked against its length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobLayout {
    pub version: u32,
    pub graph: Range<usize>,
    pub constants: Range<usize>,
}

impl BlobLayout {
    pub fn parse(blob: &[u8]) -> Result<Self, BlobError> {
        if blob.len() < 16 {
            return Err(BlobError::TooShort {
                len: blob.len(),
                needed: HEADER_LEN,
            });
        }
        let magic: [u8; 4] = blob[0..4].try_into().unwrap();
        if magic != MAGIC {
            return Err(BlobError::BadMagic { found: magic });
        }
        // The version is checked before the rest so that a newer blob, whose
        // header may have grown, gets the error that says what to do.
        let version = read_u32(blob, 4);
        if version == 0 {
            return Err(BlobError::ZeroVersion);
        }
        if version > LAYOUT_VERSION {
            return Err(BlobError::NewerVersion {
                found: version,
                supported: LAYOUT_VERSION,
            });
        }
        if blob.len() < HEADER_LEN {
            return Err(BlobError::TooShort {
                len: blob.len(),
                needed: HEADER_LEN,
            });
        }
        let header_len = read_u32(blob, 8);
        if (header_len as usize) < HEADER_LEN {
            return Err(BlobError::HeaderSize(header_len));
        }
        let graph = span(
            blob,
            "flatbuffer graph",
            read_u64(blob, 16),
            read_u64(blob, 24),
        )?;
        let constants = span(
            blob,
            "constant segment",
            read_u64(blob, 32),
            read_u64(blob, 40),
        )?;
        if graph.start < header_len as usize {
            return Err(BlobError::OutOfBounds {
                what: "flatbuffer graph (overlaps the header)",
                start: graph.start as u64,
                end: graph.end as u64,
                len: blob.len(),
            });
        }
        if constants.start % CONSTANT_ALIGNMENT != 0 {
            return Err(BlobError::MisalignedSegment(constants.start as u64));
        }
        if !constants.is_empty() && constants.start < graph.end {
            return Err(BlobError::OutOfBounds {
                what: "constant segment (overlaps the graph)",
                start: constants.start as u64,
                end: constants.end as u64,
                len: blob.len(),
            });
        }
        Ok(BlobLayout {
            version,
            graph,
            constants,
        })
    }
}

fn read_u32(blob: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(blob[at..at + 4].try_into().unwrap())
}

fn read_u64(blob: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(blob[at..at + 8].try_into().unwrap())
}

fn span(
    blob: &[u8],
    what: &'static str,
    offset: u64,
    size: u64,
) -> Result<Range<usize>, BlobError> {
    let end = offset.checked_add(size);
    match end {
        Some(end) if end <= blob.len() as u64 => Ok(offset as usize..end as usize),
        _ => Err(BlobError::OutOfBounds {
            what,
            start: offset,
            end: end.unwrap_or(u64::MAX),
            len: blob.len(),
        }),
    }
}

/// The delegate blob's bytes, owned by the C++ handle (ExecuTorch's
/// `FreeableBuffer`) rather than by Rust, so weights can be used in place.
pub struct BlobBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are never written after `new` (see its contract), so
// sharing read-only views across threads is sound.
unsafe impl Send for BlobBytes {}
unsafe impl Sync for BlobBytes {}

impl BlobBytes {
    /// # Safety
    /// `ptr..ptr + len` must be readable, unmodified and alive for as long as
    /// the returned value and anything built from it (the delegate) lives.
    pub unsafe fn new(ptr: *const u8, len: usize) -> Self {
        BlobBytes { ptr, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: guaranteed by the contract of `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A well-formed header for a graph of `graph_len` bytes followed by a
    /// segment of `segment_len` bytes.
    pub(crate) fn header(graph_len: usize, segment_len: usize) -> Vec<u8> {
        let graph_end = HEADER_LEN + graph_len;
        let segment_start = graph_end.div_ceil(CONSTANT_ALIGNMENT) * CONSTANT_ALIGNMENT;
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
        h.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        for v in [HEADER_LEN, graph_len, segment_start, segment_len] {
            h.extend_from_slice(&(v as u64).to_le_bytes());
        }
        h
    }

    fn blob(graph_len: usize, segment_len: usize) -> Vec<u8> {
        let mut b = header(graph_len, segment_len);
        b.resize(HEADER_LEN + graph_len, 7);
        b.resize(b.len().div_ceil(64) * 64 + segment_len, 9);
        b
    }

    #[test]
    fn parses_a_well_formed_header() {
        let b = blob(100, 128);
        let layout = BlobLayout::parse(&b).unwrap();
        assert_eq!(layout.version, 1);
        assert_eq!(layout.graph, 48..148);
        assert_eq!(layout.constants, 192..320);
    }

    #[test]
    fn rejects_truncation_anywhere() {
        let b = blob(100, 128);
        for cut in [0, 3, 15, 47, 147, 200, 319] {
            let err = BlobLayout::parse(&b[..cut]).unwrap_err();
            assert!(
                matches!(
                    err,
                    BlobError::TooShort { .. } | BlobError::OutOfBounds { .. }
                ),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn rejects_bad_magic_and_versions() {
        let mut b = blob(10, 0);
        b[0] = b'X';
        assert!(matches!(
            BlobLayout::parse(&b),
            Err(BlobError::BadMagic { .. })
        ));
        let mut b = blob(10, 0);
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        let err = BlobLayout::parse(&b).unwrap_err();
        assert!(matches!(
            err,
            BlobError::NewerVersion {
                found: 2,
                supported: 1
            }
        ));
        assert!(err.to_string().contains("newer than this runtime"));
        b[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(BlobLayout::parse(&b), Err(BlobError::ZeroVersion)));
    }

    #[test]
    fn rejects_overflowing_and_misaligned_spans() {
        let mut b = blob(10, 64);
        b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            BlobLayout::parse(&b),
            Err(BlobError::OutOfBounds { .. })
        ));
        let mut b = blob(10, 64);
        b[32..40].copy_from_slice(&65u64.to_le_bytes());
        b[40..48].copy_from_slice(&1u64.to_le_bytes());
        assert!(matches!(
            BlobLayout::parse(&b),
            Err(BlobError::MisalignedSegment(65))
        ));
        let mut b = blob(10, 0);
        b[16..24].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            BlobLayout::parse(&b),
            Err(BlobError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn blob_bytes_views_borrowed_memory() {
        let owner = [1u8, 2, 3];
        // SAFETY: `owner` outlives `bytes` and is not modified meanwhile.
        let bytes = unsafe { BlobBytes::new(owner.as_ptr(), owner.len()) };
        assert_eq!(bytes.as_slice(), &[1, 2, 3]);
        // SAFETY: an empty view never dereferences the pointer.
        let empty = unsafe { BlobBytes::new(std::ptr::null(), 0) };
        assert!(empty.as_slice().is_empty());
    }
}
