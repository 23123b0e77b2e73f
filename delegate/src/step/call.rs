//! What a step sees of one call: the values' shapes and data.

use rustconv_kernels::fused::{Env, ShapeGeneration};
use rustconv_kernels::Scratch;

use crate::shape::Shape;

/// The values of one call as a step reads and writes them.
pub struct Call<'a> {
    shapes: &'a [Shape],
    data: &'a [*mut u8],
    pub scratch: &'a Scratch,
    /// The number of this call's shapes (see [`Env::generation`]).
    generation: Option<ShapeGeneration>,
}

impl<'a> Call<'a> {
    /// # Safety
    /// For every value a step of this call names, `data[v]` points to
    /// `shapes[v].numel()` f32s valid for `'a` (checked against nbytes and
    /// alignment for arguments, against the segment for constants, planned
    /// within the arena for intermediates), or is null for a value no step
    /// reads. While a step runs, a value it writes is read or written by
    /// nothing else: programs never load a value their own kernel produces
    /// (fusion.rs) except the statistics, which the step writes first; and
    /// the planner keeps values live at the same step apart (arguments:
    /// `check_outputs_disjoint`).
    ///
    /// `generation` numbers `shapes`: every call given it has these shapes.
    pub unsafe fn new(
        shapes: &'a [Shape],
        data: &'a [*mut u8],
        scratch: &'a Scratch,
        generation: Option<ShapeGeneration>,
    ) -> Self {
        Call {
            shapes,
            data,
            scratch,
            generation,
        }
    }

    /// The shape of `v` this call.
    pub fn shape(&self, v: usize) -> Shape {
        self.shapes[v]
    }

    /// Elements along the last dimension of `v`.
    pub fn row_len(&self, v: usize) -> usize {
        self.shape(v).dims().last().copied().unwrap_or(1)
    }

    /// A stored value the step reads.
    pub fn view(&self, v: usize) -> &[f32] {
        self.data(v)
    }

    /// A stored value the step writes.
    // One `&self` hands out several disjoint outputs (see `new`).
    #[allow(clippy::mut_from_ref)]
    pub fn out(&self, v: usize) -> &mut [f32] {
        let n = self.shapes[v].numel();
        assert!(!self.data[v].is_null() || n == 0, "value {v} is not stored");
        // SAFETY: `data[v]` holds `n` f32s and nothing else reads or writes
        // them while the step that writes them runs (see `new`).
        unsafe { std::slice::from_raw_parts_mut(self.data[v].cast::<f32>(), n) }
    }
}

// SAFETY: a call is shared with the pool's threads during a step; through
// it they only read the pointers (never change them), and what they read or
// write through them is governed by `new`'s contract.
unsafe impl Sync for Call<'_> {}

impl Env for Call<'_> {
    fn shape(&self, value: usize) -> Shape {
        self.shapes[value]
    }

    fn data(&self, value: usize) -> &[f32] {
        let n = self.shapes[value].numel();
        let ptr = self.data[value];
        // Programs load only stored values (fusion.rs); this turns a broken
        // plan into a panic rather than a read through null.
        assert!(!ptr.is_null() || n == 0, "value {value} is not stored");
        // SAFETY: `ptr` points to `n` f32s and no step writes a value while
        // a program of the same step reads it (see `new`).
        unsafe { std::slice::from_raw_parts(ptr as *const f32, n) }
    }

    fn generation(&self) -> Option<ShapeGeneration> {
        self.generation
    }
}
