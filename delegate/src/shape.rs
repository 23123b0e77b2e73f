//! A tensor shape held inline, so shapes computed during `execute` need no
//! heap allocation.

use crate::graph::MAX_RANK;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    dims: [usize; MAX_RANK],
    rank: usize,
}

impl Shape {
    /// Panics if `dims` is longer than [`MAX_RANK`]; callers validate ranks
    /// against the graph (whose ranks are checked at decode) first.
    pub fn new(dims: &[usize]) -> Self {
        assert!(dims.len() <= MAX_RANK, "rank {} > {MAX_RANK}", dims.len());
        let mut s = Shape {
            dims: [0; MAX_RANK],
            rank: dims.len(),
        };
        s.dims[..dims.len()].copy_from_slice(dims);
        s
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// The shape as ExecuTorch's `SizesType` (i32), for resizing outputs.
    pub fn to_i32(self) -> ([i32; MAX_RANK], usize) {
        let mut out = [0i32; MAX_RANK];
        for (o, &d) in out.iter_mut().zip(self.dims()) {
            *o = d as i32;
        }
        (out, self.rank)
    }
}

impl std::ops::Index<usize> for Shape {
    type Output = usize;
    fn index(&self, i: usize) -> &usize {
        &self.dims()[i]
    }
}
