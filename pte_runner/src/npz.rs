//! Tensors in and out of `.npz` files (numpy.savez): a zip of `.npy` arrays.
//! zip does the container, npyz the array format.

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

trait LeBytes: Sized {
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! le_bytes {
    ($($t:ty),*) => {$(
        impl LeBytes for $t {
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().unwrap())
            }
        }
    )*};
}
le_bytes!(u8, i8, i16, i32, i64, f16, f32, f64);

impl LeBytes for bool {
    fn put(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
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

fn parse_npy(bytes: &[u8]) -> Result<Array, String> {
    let npy = npyz::NpyFile::new(bytes).map_err(|e| format!("not a valid .npy array: {e}"))?;
    if npy.order() == npyz::Order::Fortran && npy.shape().len() > 1 {
        return Err("Fortran-order arrays are not supported; save np.ascontiguousarray(x)".into());
    }
    let descr = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => return Err(format!("unsupported dtype {}", other.descr())),
    };
    let code = descr.trim_start_matches(['<', '|', '=']);
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
    .find(|t| t.npy_code() == code && !descr.starts_with('>'))
    .ok_or_else(|| format!("unsupported dtype '{descr}'"))?;
    let shape = npy.shape().iter().map(|&d| d as usize).collect();
    let mut data = Vec::with_capacity(npy.len() as usize * dtype.size());
    with_type!(dtype, T => {
        for x in npy.into_vec::<T>().map_err(|e| format!("cannot read data: {e}"))? {
            x.put(&mut data);
        }
    });
    Ok(Array { dtype, shape, data })
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
}
