//! A method's inputs and outputs as npz [`Array`]s: random inputs of the
//! shapes it declares, binding inputs to a session, reading its outputs.

use rand::{rngs::SmallRng, Rng, SeedableRng};

use crate::ffi::bridge as et;
use crate::npz::{Array, ElemType};

/// Uniform in [-1, 1) for floats, small non-negative values for integers (0
/// to 4), of the shapes the method declares (the upper bounds for dynamic
/// dimensions).
pub fn random_inputs(session: &et::Session, seed: u64) -> Result<Vec<Array>, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..session.num_inputs())
        .map(|i| {
            let info = session.input_info(i).map_err(|e| e.what().to_owned())?;
            let dtype = ElemType::from_scalar_type(info.dtype).ok_or_else(|| {
                format!(
                    "input {i} has ScalarType {}, unsupported for random inputs",
                    info.dtype
                )
            })?;
            random_array(dtype, &info.sizes, &mut rng).map_err(|e| format!("input {i}: {e}"))
        })
        .collect()
}

/// An array of `sizes`, which come from the program: checked, and its
/// buffer reserved fallibly, so corrupt sizes are an error, not an abort.
/// (ExecuTorch refuses the corrupt sizes tried so far when it loads the
/// method; this does not rely on it.)
fn random_array(dtype: ElemType, sizes: &[i32], rng: &mut SmallRng) -> Result<Array, String> {
    let bad_sizes = || format!("sizes {sizes:?} do not make an array");
    let shape = sizes
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| bad_sizes())?;
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(bad_sizes)?;
    let bytes = numel.checked_mul(dtype.size()).ok_or_else(bad_sizes)?;
    let mut data = Vec::new();
    data.try_reserve_exact(bytes)
        .map_err(|e| format!("sizes {sizes:?}: cannot allocate {bytes} bytes: {e}"))?;
    for _ in 0..numel {
        let x: f64 = rng.gen_range(-1.0..1.0);
        match dtype {
            ElemType::F32 => data.extend_from_slice(&(x as f32).to_le_bytes()),
            ElemType::F64 => data.extend_from_slice(&x.to_le_bytes()),
            ElemType::F16 => data.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            ElemType::Bool => data.push((x > 0.0) as u8),
            // Non-negative: integer inputs are mostly indices
            // (token ids, positions), and a negative one is refused.
            int => {
                let v = (x.abs() * 4.0).round() as i64;
                data.extend_from_slice(&v.to_le_bytes()[..int.size()]);
            }
        }
    }
    Ok(Array { dtype, shape, data })
}

/// Hands `inputs` to the session as its inputs 0, 1, ..., each checked
/// against the dtype the method declares.
///
/// # Safety
/// The session reads the arrays in place at every later `reload_inputs` and
/// `execute`: `inputs` must stay alive and unchanged until the session is
/// dropped or given other inputs.
pub unsafe fn bind_inputs(
    session: &mut cxx::UniquePtr<et::Session>,
    inputs: &[Array],
) -> Result<(), String> {
    for (i, array) in inputs.iter().enumerate() {
        let expected = session.input_info(i).map_err(|e| e.what().to_owned())?;
        if expected.dtype != array.dtype.scalar_type() {
            return Err(format!(
                "input {i} is {:?} but the method expects {:?}",
                array.dtype,
                ElemType::from_scalar_type(expected.dtype)
            ));
        }
        let sizes: Vec<i32> = array.shape.iter().map(|&d| d as i32).collect();
        // SAFETY: the caller keeps `inputs` alive and unchanged (above).
        unsafe {
            session
                .pin_mut()
                .set_input(i, array.dtype.scalar_type(), &sizes, &array.data)
        }
        .map_err(|e| format!("input {i} with shape {:?}: {}", array.shape, e.what()))?;
    }
    Ok(())
}

/// The method's outputs after its last execute, copied out.
pub fn read_outputs(session: &et::Session) -> Result<Vec<Array>, String> {
    (0..session.num_outputs())
        .map(|i| {
            let info = session.output_info(i).map_err(|e| e.what().to_owned())?;
            let dtype = ElemType::from_scalar_type(info.dtype)
                .ok_or_else(|| format!("output {i} has unsupported ScalarType {}", info.dtype))?;
            let data = session
                .output_data(i)
                .map_err(|e| e.what().to_owned())?
                .to_vec();
            Ok(Array {
                dtype,
                shape: info.sizes.iter().map(|&d| d as usize).collect(),
                data,
            })
        })
        .collect()
}

/// Whether the session's current outputs are `want`, bit for bit (shape,
/// dtype and bytes), without copying them.
pub fn outputs_equal(session: &et::Session, want: &[Array]) -> Result<bool, String> {
    if session.num_outputs() != want.len() {
        return Ok(false);
    }
    for (i, w) in want.iter().enumerate() {
        let info = session.output_info(i).map_err(|e| e.what().to_owned())?;
        let data = session.output_data(i).map_err(|e| e.what().to_owned())?;
        let same_shape = info.sizes.len() == w.shape.len()
            && info
                .sizes
                .iter()
                .zip(&w.shape)
                .all(|(&a, &b)| a as usize == b);
        if info.dtype != w.dtype.scalar_type() || !same_shape || data != w.data.as_slice() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_arrays_refuse_sizes_that_make_no_array() {
        let mut rng = SmallRng::seed_from_u64(0);
        let a = random_array(ElemType::I64, &[2, 3], &mut rng).unwrap();
        assert_eq!((a.shape, a.data.len()), (vec![2, 3], 48));
        for sizes in [&[-1, 4][..], &[i32::MAX, i32::MAX, i32::MAX]] {
            let err = random_array(ElemType::F32, sizes, &mut rng).unwrap_err();
            assert!(err.contains("do not make an array"), "{err}");
        }
        // Representable but not allocatable: an error, not an abort.
        let err = random_array(ElemType::F64, &[i32::MAX, 1 << 20], &mut rng).unwrap_err();
        assert!(err.contains("cannot allocate"), "{err}");
    }
}
