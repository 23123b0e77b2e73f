//! Shapes are the kernels crate's [`Shape`] (held inline, so shapes computed
//! during `execute` need no heap allocation); this adds what ExecuTorch
//! needs of them.

pub use rustconv_kernels::Shape;

/// The shape as ExecuTorch's `SizesType` (i32), for resizing outputs.
pub fn to_i32(shape: Shape) -> ([i32; rustconv_kernels::MAX_RANK], usize) {
    let mut out = [0i32; rustconv_kernels::MAX_RANK];
    for (o, &d) in out.iter_mut().zip(shape.dims()) {
        *o = d as i32;
    }
    (out, shape.rank())
}
