//! Tensors in and out of `.npz` files (numpy.savez): a zip of `.npy` arrays.
//! zip does the container; npyz writes the arrays, and `parse_npy` reads
//! them (it says why not npyz).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use half::f16;
use npyz::WriterBuilder;

/// Element types pte_runner moves between npz files and ExecuTorch, with
/// ExecuTorch's ScalarType codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    U8,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
    Bool,
}

impl ElemType {
    pub fn from_scalar_type(code: i8) -> Option<Self> {
        Some(match code {
            0 => ElemType::U8,
            1 => ElemType::I8,
            2 => ElemType::I16,
            3 => ElemType::I32,
            4 => ElemType::I64,
            5 => ElemType::F16,
            6 => ElemType::F32,
            7 => ElemType::F64,
            11 => ElemType::Bool,
            _ => return None,
        })
    }

    pub fn scalar_type(self) -> i8 {
        match self {
            ElemType::U8 => 0,
            ElemType::I8 => 1,
            ElemType::I16 => 2,
            ElemType::I32 => 3,
            ElemType::I64 => 4,
            ElemType::F16 => 5,
            ElemType::F32 => 6,
            ElemType::F64 => 7,
            ElemType::Bool => 11,
        }
    }

    /// numpy's type string, without the byte-order mark.
    fn npy_code(self) -> &'static str {
        match self {
            ElemType::U8 => "u1",
            ElemType::I8 => "i1",
            ElemType::I16 => "i2",
            ElemType::I32 => "i4",
            ElemType::I64 => "i8",
            ElemType::F16 => "f2",
            ElemType::F32 => "f4",
            ElemType::F64 => "f8",
            ElemType::Bool => "b1",
        }
    }

    pub fn size(self) -> usize {
        match self {
            ElemType::U8 | ElemType::I8 | ElemType::Bool => 1,
            ElemType::I16 | ElemType::F16 => 2,
            ElemType::I32 | ElemType::F32 => 4,
            ElemType::I64 | ElemType::F64 => 8,
        }
    }
}

/// A dense, row-major array with little-endian elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub dtype: ElemType,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Runs `$body` with `$t` bound to the Rust type of `$dtype`.
macro_rules! with_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            ElemType::U8 => {
                type $t = u8;
                $body
            }
            ElemType::I8 => {
                type $t = i8;
                $body
            }
            ElemType::I16 => {
                type $t = i16;
                $body
            }
            ElemType::I32 => {
                type $t = i32;
                $body
            }
            ElemType::I64 => {
                type $t = i64;
                $body
            }
            ElemType::F16 => {
                type $t = f16;
                $body
            }
            ElemType::F32 => {
                type $t = f32;
                $body
            }
            ElemType::F64 => {
                type $t = f64;
                $body
            }
            ElemType::Bool => {
                type $t = bool;
                $body
            }
        }
    };
}

/// An element from its little-endian bytes, for npyz's writer.
trait FromLeBytes: Sized {
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! from_le_bytes {
    ($($t:ty),*) => {$(
        impl FromLeBytes for $t {
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().unwrap())
            }
        }
    )*};
}
from_le_bytes!(u8, i8, i16, i32, i64, f16, f32, f64);

impl FromLeBytes for bool {
    fn get(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

/// Reads every array of `path` named by a number ("0.npy", "1.npy", ...).
pub fn read_all(path: &Path) -> Result<HashMap<usize, Array>, String> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| format!("{} is not an npz file: {e}", path.display()))?;
    let mut arrays = HashMap::new();
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let Some(index) = entry
            .name()
            .strip_suffix(".npy")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read array \"{index}\" of {}: {e}", path.display()))?;
        let array = parse_npy(&bytes)
            .map_err(|e| format!("array \"{index}\" of {}: {e}", path.display()))?;
        arrays.insert(index, array);
    }
    Ok(arrays)
}

/// Arrays "0" to `count - 1` of `arrays`, read from `path`, in input order.
pub fn select_inputs(
    mut arrays: HashMap<usize, Array>,
    path: &Path,
    count: usize,
) -> Result<Vec<Array>, String> {
    (0..count)
        .map(|i| {
            arrays
                .remove(&i)
                .ok_or_else(|| format!("{} has no array named \"{i}\" (input {i})", path.display()))
        })
        .collect()
}

/// Why a `.npy` array cannot be read. Every size in the file is checked
/// against the bytes present before anything is allocated from it.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum NpyError {
    #[error("not a .npy array (no \\x93NUMPY magic)")]
    Magic,
    #[error(".npy format version {0}.{1} is not supported (1.0, 2.0 or 3.0)")]
    Version(u8, u8),
    #[error(".npy file ends after {0} bytes, inside its preamble")]
    Truncated(usize),
    #[error(".npy header claims {claimed} bytes but {available} follow its length field")]
    HeaderLength { claimed: usize, available: usize },
    #[error(".npy header is not a dict of 'descr', 'fortran_order' and 'shape': {0}")]
    Header(String),
    #[error("unsupported dtype '{0}'")]
    Dtype(String),
    #[error("Fortran-order arrays are not supported; save np.ascontiguousarray(x)")]
    Fortran,
    #[error("dimension {0} of the shape exceeds ExecuTorch's sizes (int32)")]
    Dimension(u64),
    #[error("shape {shape:?} of {elem_size}-byte elements overflows the address space")]
    Overflow { shape: Vec<usize>, elem_size: usize },
    #[error("shape {shape:?} needs {needed} bytes of data but the array has {found}")]
    DataLength {
        shape: Vec<usize>,
        needed: usize,
        found: usize,
    },
}

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// Parses a `.npy` file (format versions 1 to 3, numpy's layout: magic,
/// version, header length, a Python dict literal, then the raw elements).
/// The header is read here rather than by npyz, whose reader allocates the
/// header's claimed length (up to 4 GiB) before reading it and multiplies
/// the shape unchecked (wrapping, or a panic where overflow checks are on).
pub fn parse_npy(bytes: &[u8]) -> Result<Array, NpyError> {
    if !bytes.starts_with(NPY_MAGIC) || bytes.len() < NPY_MAGIC.len() + 2 {
        return Err(NpyError::Magic);
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (length_bytes, header_len) = match (major, minor) {
        (1, 0) => (
            2,
            bytes
                .get(8..10)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize),
        ),
        (2, 0) | (3, 0) => (
            4,
            bytes
                .get(8..12)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize),
        ),
        _ => return Err(NpyError::Version(major, minor)),
    };
    let header_len = header_len.ok_or(NpyError::Truncated(bytes.len()))?;
    let text_start = 8 + length_bytes;
    let available = bytes.len() - text_start;
    if header_len > available {
        return Err(NpyError::HeaderLength {
            claimed: header_len,
            available,
        });
    }
    let text = std::str::from_utf8(&bytes[text_start..text_start + header_len])
        .map_err(|_| NpyError::Header("not UTF-8".into()))?;
    let header = Header::parse(text)?;
    if header.fortran_order && header.shape.len() > 1 {
        return Err(NpyError::Fortran);
    }
    let code = header.descr.trim_start_matches(['<', '|', '=']);
    let dtype = [
        ElemType::U8,
        ElemType::I8,
        ElemType::I16,
        ElemType::I32,
        ElemType::I64,
        ElemType::F16,
        ElemType::F32,
        ElemType::F64,
        ElemType::Bool,
    ]
    .into_iter()
    .find(|t| t.npy_code() == code && !header.descr.starts_with('>'))
    .ok_or_else(|| NpyError::Dtype(header.descr.clone()))?;
    let shape = header.shape;
    let needed = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| NpyError::Overflow {
            shape: shape.clone(),
            elem_size: dtype.size(),
        })?;
    let elements = &bytes[text_start + header_len..];
    if elements.len() != needed {
        return Err(NpyError::DataLength {
            shape,
            needed,
            found: elements.len(),
        });
    }
    // The elements are already little-endian and dense, as `Array` holds
    // them; booleans become 0 or 1, the only bytes a C++ bool may hold.
    let data = match dtype {
        ElemType::Bool => elements.iter().map(|&b| u8::from(b != 0)).collect(),
        _ => elements.to_vec(),
    };
    Ok(Array { dtype, shape, data })
}

/// The dict literal of a `.npy` header, e.g.
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4, 32), }`
/// padded with spaces and a newline: strings without escapes, `True` and
/// `False`, tuples (or lists) of non-negative integers; nothing nests
/// deeper, so nothing here recurses.
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

impl Header {
    fn parse(text: &str) -> Result<Self, NpyError> {
        let mut c = Cursor {
            s: text.as_bytes(),
            at: 0,
        };
        let (mut descr, mut fortran_order, mut shape) = (None, None, None);
        c.expect(b'{')?;
        while !c.eat(b'}') {
            let key = c.string()?;
            c.expect(b':')?;
            match key {
                "descr" if descr.is_none() => descr = Some(c.string()?.to_owned()),
                "fortran_order" if fortran_order.is_none() => fortran_order = Some(c.boolean()?),
                "shape" if shape.is_none() => shape = Some(c.shape()?),
                _ => return Err(c.error(&format!("unexpected or repeated key '{key}'"))),
            }
            if !c.eat(b',') {
                c.expect(b'}')?;
                break;
            }
        }
        c.skip_space();
        if c.at != c.s.len() {
            return Err(c.error("text after the dict"));
        }
        let missing = |key: &str| NpyError::Header(format!("no '{key}'"));
        Ok(Header {
            descr: descr.ok_or_else(|| missing("descr"))?,
            fortran_order: fortran_order.ok_or_else(|| missing("fortran_order"))?,
            shape: shape.ok_or_else(|| missing("shape"))?,
        })
    }
}

struct Cursor<'a> {
    s: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn error(&self, what: &str) -> NpyError {
        NpyError::Header(format!("{what} at byte {}", self.at))
    }

    fn skip_space(&mut self) {
        while self.s.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    /// Skips spaces, then `b` if it is next.
    fn eat(&mut self, b: u8) -> bool {
        self.skip_space();
        let found = self.s.get(self.at) == Some(&b);
        self.at += usize::from(found);
        found
    }

    fn expect(&mut self, b: u8) -> Result<(), NpyError> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.error(&format!("expected '{}'", b as char)))
        }
    }

    fn string(&mut self) -> Result<&'a str, NpyError> {
        self.skip_space();
        let quote = match self.s.get(self.at) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(self.error("expected a string")),
        };
        let start = self.at + 1;
        let len = self.s[start..]
            .iter()
            .position(|&b| b == quote || b == b'\\')
            .filter(|&n| self.s[start + n] == quote)
            .ok_or_else(|| self.error("unterminated or escaped string"))?;
        self.at = start + len + 1;
        // The text is UTF-8 and the quotes are ASCII, so this is a char
        // boundary on both sides.
        std::str::from_utf8(&self.s[start..start + len]).map_err(|_| self.error("bad string"))
    }

    fn boolean(&mut self) -> Result<bool, NpyError> {
        self.skip_space();
        for (word, value) in [("True", true), ("False", false)] {
            if self.s[self.at..].starts_with(word.as_bytes()) {
                self.at += word.len();
                return Ok(value);
            }
        }
        Err(self.error("expected True or False"))
    }

    /// A tuple or list of dimensions, each at most `i32::MAX` (ExecuTorch's
    /// sizes are int32).
    fn shape(&mut self) -> Result<Vec<usize>, NpyError> {
        let close = if self.eat(b'(') {
            b')'
        } else if self.eat(b'[') {
            b']'
        } else {
            return Err(self.error("expected a tuple"));
        };
        let mut shape = Vec::new();
        while !self.eat(close) {
            shape.push(self.dimension()?);
            if !self.eat(b',') {
                self.expect(close)?;
                break;
            }
        }
        Ok(shape)
    }

    fn dimension(&mut self) -> Result<usize, NpyError> {
        self.skip_space();
        let digits = self.s[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return Err(self.error("expected a non-negative integer"));
        }
        let mut value = 0u64;
        for &b in &self.s[self.at..self.at + digits] {
            value = value.saturating_mul(10).saturating_add(u64::from(b - b'0'));
        }
        self.at += digits;
        if value > i32::MAX as u64 {
            return Err(NpyError::Dimension(value));
        }
        Ok(value as usize)
    }
}

/// Writes `arrays` as "0", "1", ... to `path`.
pub fn write_outputs(path: &Path, arrays: &[Array]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", path.display());
    let file = File::create(path).map_err(|e| fail(&e))?;
    let mut zip = zip::ZipWriter::new(file);
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (i, array) in arrays.iter().enumerate() {
        zip.start_file(format!("{i}.npy"), options)
            .map_err(|e| fail(&e))?;
        let npy = encode_npy(array).map_err(|e| fail(&e))?;
        zip.write_all(&npy).map_err(|e| fail(&e))?;
    }
    zip.finish().map_err(|e| fail(&e))?;
    Ok(())
}

fn encode_npy(array: &Array) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let shape: Vec<u64> = array.shape.iter().map(|&d| d as u64).collect();
    with_type!(array.dtype, T => {
        let mut writer = npyz::WriteOptions::<T>::new()
            .default_dtype()
            .shape(&shape)
            .writer(&mut out)
            .begin_nd()?;
        writer.extend(array.data.chunks_exact(array.dtype.size()).map(T::get))?;
        writer.finish()?;
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        let dir = std::env::temp_dir().join(format!("pte_runner_npz_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.npz");
        let arrays: Vec<Array> = [
            ElemType::U8,
            ElemType::I8,
            ElemType::I16,
            ElemType::I32,
            ElemType::I64,
            ElemType::F16,
            ElemType::F32,
            ElemType::F64,
            ElemType::Bool,
        ]
        .into_iter()
        .map(|dtype| Array {
            dtype,
            shape: vec![2, 3],
            data: (0..6 * dtype.size())
                .map(|i| {
                    if dtype == ElemType::Bool {
                        (i % 2) as u8
                    } else {
                        (i * 7 % 251) as u8 & 0x3f
                    }
                })
                .collect(),
        })
        .collect();
        write_outputs(&path, &arrays).unwrap();
        let read = |count| select_inputs(read_all(&path)?, &path, count);
        assert_eq!(read(arrays.len()).unwrap(), arrays);
        let err = read(arrays.len() + 1).unwrap_err();
        assert!(err.contains("no array named \"9\""), "{err}");
        std::fs::write(&path, b"not a zip").unwrap();
        assert!(read_all(&path).unwrap_err().contains("is not an npz file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A version 1.0 `.npy` file: `header` padded as numpy pads it, then
    /// `data_len` bytes of elements.
    fn npy(header: &str, data_len: usize) -> Vec<u8> {
        let mut text = header.to_owned();
        while !(10 + text.len() + 1).is_multiple_of(64) {
            text.push(' ');
        }
        text.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        out.extend((0..data_len).map(|i| i as u8));
        out
    }

    #[test]
    fn reads_what_numpy_writes() {
        let a = parse_npy(&npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
            24,
        ))
        .unwrap();
        assert_eq!((a.dtype, a.shape.as_slice()), (ElemType::F32, &[2, 3][..]));
        assert_eq!(a.data, (0..24).collect::<Vec<u8>>());
        let scalar = parse_npy(&npy(
            "{\"descr\": \"|b1\", \"fortran_order\": True, \"shape\": ()}",
            1,
        ))
        .unwrap();
        assert_eq!((scalar.shape.len(), scalar.data), (0, vec![0]));
        // A C++ bool may only hold 0 or 1.
        let mut bools = npy(
            "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
            0,
        );
        bools.extend([0, 7]);
        assert_eq!(parse_npy(&bools).unwrap().data, [0, 1]);
    }

    #[test]
    fn a_shape_larger_than_the_data_is_refused_before_allocating() {
        // 32 GB claimed, 320 bytes present: refused with the sizes, nothing
        // allocated from the claim (this aborted pte_runner).
        let bytes = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4, 2000000000), }",
            320,
        );
        assert_eq!(
            parse_npy(&bytes),
            Err(NpyError::DataLength {
                shape: vec![1, 4, 2_000_000_000],
                needed: 32_000_000_000,
                found: 320,
            })
        );
        // Fewer or more bytes than the shape needs.
        for len in [23, 25] {
            let bytes = npy(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                len,
            );
            assert!(
                matches!(
                    parse_npy(&bytes),
                    Err(NpyError::DataLength { needed: 24, .. })
                ),
                "{len}"
            );
        }
    }

    #[test]
    fn shapes_whose_size_overflows_are_refused() {
        // (2^62, 4) wrapped to an empty array: every dimension is an int32
        // in ExecuTorch, and the product is checked.
        let bytes = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
            0,
        );
        assert_eq!(parse_npy(&bytes), Err(NpyError::Dimension(1 << 62)));
        let huge = "99999999999999999999999999999999999999";
        let bytes = npy(
            &format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({huge},), }}"),
            0,
        );
        assert!(matches!(parse_npy(&bytes), Err(NpyError::Dimension(_))));
        let bytes = npy(
            "{'descr': '<f8', 'fortran_order': False, \
             'shape': (2147483647, 2147483647, 2147483647, 4), }",
            0,
        );
        assert!(matches!(parse_npy(&bytes), Err(NpyError::Overflow { .. })));
        // A zero dimension makes the array empty whatever the others are.
        let bytes = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 2147483647), }",
            0,
        );
        assert!(parse_npy(&bytes).unwrap().data.is_empty());
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
        let good = npy(f4, 4);
        assert_eq!(parse_npy(b"\x93NUMPY"), Err(NpyError::Magic));
        assert_eq!(parse_npy(b"PK\x03\x04 not npy"), Err(NpyError::Magic));
        let mut v4 = good.clone();
        v4[6] = 4;
        assert_eq!(parse_npy(&v4), Err(NpyError::Version(4, 0)));
        // A header length past the end of the file, in both length widths
        // (version 2 has four bytes: up to 4 GiB claimed by 12 bytes).
        let mut long = good.clone();
        long[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            parse_npy(&long),
            Err(NpyError::HeaderLength { claimed: 65535, .. })
        ));
        let v2 = b"\x93NUMPY\x02\x00\xff\xff\xff\xff{}";
        assert!(matches!(
            parse_npy(v2),
            Err(NpyError::HeaderLength {
                claimed: 0xffff_ffff,
                available: 2
            })
        ));
        assert_eq!(
            parse_npy(b"\x93NUMPY\x01\x00\x05"),
            Err(NpyError::Truncated(9))
        );
        assert_eq!(
            parse_npy(b"\x93NUMPY\x02\x00\x05\x00\x00"),
            Err(NpyError::Truncated(11))
        );
        for header in [
            "",
            "{",
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
            "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ((1,),)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",
            "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}",
            "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}",
        ] {
            assert!(
                matches!(parse_npy(&npy(header, 4)), Err(NpyError::Header(_))),
                "{header}: {:?}",
                parse_npy(&npy(header, 4))
            );
        }
        for (header, want) in [
            (
                "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                NpyError::Dtype(">f4".into()),
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
                NpyError::Dtype("<c8".into()),
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1), }",
                NpyError::Fortran,
            ),
        ] {
            assert_eq!(parse_npy(&npy(header, 4)), Err(want), "{header}");
        }
        let mut not_utf8 = good.clone();
        not_utf8[12] = 0xff;
        assert!(matches!(parse_npy(&not_utf8), Err(NpyError::Header(_))));
    }
}
