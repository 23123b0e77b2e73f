//! A tensor shape held inline (rank at most [`MAX_RANK`]), so shapes
//! computed during a call need no heap allocation.

/// The highest rank any tensor here has; every op of the delegate uses 1 to 4.
pub const MAX_RANK: usize = 4;

/// Dimensions of a row-major tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    dims: [usize; MAX_RANK],
    rank: usize,
}

impl Shape {
    /// Panics if `dims` is longer than [`MAX_RANK`]; callers validate ranks
    /// (the delegate checks them when it decodes a graph).
    pub fn new(dims: &[usize]) -> Self {
        assert!(dims.len() <= MAX_RANK, "rank {} > {MAX_RANK}", dims.len());
        let mut s = Shape {
            dims: [0; MAX_RANK],
            rank: dims.len(),
        };
        s.dims[..dims.len()].copy_from_slice(dims);
        s
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// Row-major (contiguous) strides in elements; entries past the rank are 0.
    pub fn strides(&self) -> [usize; MAX_RANK] {
        let mut strides = [0; MAX_RANK];
        let mut stride = 1;
        for d in (0..self.rank).rev() {
            strides[d] = stride;
            stride *= self.dims[d];
        }
        strides
    }

    /// This shape with dimension `d` set to `size`.
    pub fn with(mut self, d: usize, size: usize) -> Self {
        assert!(d < self.rank, "dimension {d} of a rank-{} shape", self.rank);
        self.dims[d] = size;
        self
    }
}

impl std::ops::Index<usize> for Shape {
    type Output = usize;
    fn index(&self, i: usize) -> &usize {
        &self.dims()[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_are_row_major() {
        let s = Shape::new(&[2, 3, 4]);
        assert_eq!(s.strides(), [12, 4, 1, 0]);
        assert_eq!(s.numel(), 24);
        assert_eq!(s.with(1, 5).dims(), &[2, 5, 4]);
    }
}
