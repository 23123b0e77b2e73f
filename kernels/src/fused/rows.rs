//! How a conv or scan kernel reads a fused operand and writes through a
//! fused epilogue, one row chunk at a time (the prologue / epilogue hooks).
//!
//! A kernel that supports fusion takes [`RowsIn`] and [`RowsOut`] instead
//! of plain slices. Rows are the kernel's `(batch, channel)` rows, elements
//! run along time, exactly as the kernel walks its data; a fused operand is
//! then computed into a per-thread buffer right before the kernel reads it,
//! and a fused result is finished and stored right after the kernel wrote
//! it, while both are still in L1.

#![allow(unsafe_code)]

use std::marker::PhantomData;

use super::compiled::{CompiledProgram, EpilogueRecipe, Gather, Prologue};
use super::ops::{copy, copy_streaming};
use super::program::{Env, Line};
use super::shape::{Shape, MAX_RANK};
use super::strided;
use crate::simd::Isa;

/// Computes elements of an operand on the fly (a fused prologue).
pub trait RowSource: Sync {
    /// Writes elements `t0 .. t0 + out.len()` of row `row` into `out`.
    /// `tmp` holds at least `self.temporaries() * out.len()` elements.
    fn fill(&self, row: usize, t0: usize, out: &mut [f32], tmp: &mut [f32]);
    /// Line-sized temporaries `fill` needs.
    fn temporaries(&self) -> usize;
    /// The instruction set the source was prepared with, which the moves
    /// of its values (short rows written from their columns) take too.
    fn isa(&self) -> Isa;
    /// Writes elements `t0 .. t0 + len` of rows `row0 .. row0 + rows` (rows
    /// of one batch item, consecutive channels) into `out`, row after row
    /// (`rows * len` elements). `tmp` holds at least [`block_tmp`]`(temporaries,
    /// len)` elements. By default row by row; a source whose rows are far
    /// apart in memory (a transposed tensor) reads across them instead.
    fn fill_rows(
        &self,
        row0: usize,
        rows: usize,
        t0: usize,
        len: usize,
        out: &mut [f32],
        tmp: &mut [f32],
    ) {
        for (r, out) in out.chunks_exact_mut(len).take(rows).enumerate() {
            self.fill(row0 + r, t0, out, tmp);
        }
    }

    /// Writes element `t` of rows `row0 .. row0 + out.len()` into `out`: a
    /// column, as a decode step (a time extent of one or a few) reads its
    /// operand. The rows are consecutive channels of one batch item. `tmp`
    /// holds at least [`col_tmp`]`(temporaries, out.len())` elements. By
    /// default an element per row; a program evaluates one line across the
    /// rows, paying its per-line set-up once instead of per row.
    fn fill_col(&self, row0: usize, t: usize, out: &mut [f32], tmp: &mut [f32]) {
        for (r, o) in out.iter_mut().enumerate() {
            self.fill(row0 + r, t, std::slice::from_mut(o), tmp);
        }
    }

    /// How many consecutive rows (from a multiple of it) one
    /// [`Self::fill_col`] may take: the channels of a batch item.
    fn col_rows(&self) -> usize {
        1
    }

    /// Whether this operand is read better a column at a time than a row
    /// at a time: its rows lie far apart in memory and its columns close
    /// together (a transposed `[B, N, C]` tensor).
    fn prefers_columns(&self) -> bool {
        false
    }

    /// Whether whole rows of one batch item, `len` elements each, lie end
    /// to end in every operand, so that [`Self::fill_rows`] of whole rows
    /// computes them as one line. False by default.
    fn whole_rows_one_line(&self, len: usize) -> bool {
        let _ = len;
        false
    }
}

/// Scratch elements [`RowSource::fill_col`], [`PairSource::fill_pair_col`]
/// and [`RowSink::store_col`] need for columns of `rows` rows and programs
/// needing `temporaries` temporaries.
pub fn col_tmp(temporaries: usize, rows: usize) -> usize {
    temporaries * rows
}

/// Computes two operands of a kernel together: a prologue whose results
/// share subexpressions (a scan's `a = exp(-softplus(p) * A)` and
/// `u = softplus(p) * x`), each computed once per line.
pub trait PairSource: Sync {
    /// Writes elements `t0 .. t0 + first.len()` of row `row` of both
    /// operands (`first` and `second` equally long). `tmp` holds at least
    /// `self.pair_temporaries() * first.len()` elements.
    fn fill_pair(
        &self,
        row: usize,
        t0: usize,
        first: &mut [f32],
        second: &mut [f32],
        tmp: &mut [f32],
    );
    /// Line-sized temporaries `fill_pair` needs.
    fn pair_temporaries(&self) -> usize;
    /// Element `t` of rows `row0 .. row0 + first.len()` of both operands,
    /// as [`RowSource::fill_col`].
    fn fill_pair_col(
        &self,
        row0: usize,
        t: usize,
        first: &mut [f32],
        second: &mut [f32],
        tmp: &mut [f32],
    ) {
        for (r, (f, s)) in first.iter_mut().zip(second.iter_mut()).enumerate() {
            self.fill_pair(
                row0 + r,
                t,
                std::slice::from_mut(f),
                std::slice::from_mut(s),
                tmp,
            );
        }
    }
}

/// Finishes and stores a kernel's output (a fused epilogue).
pub trait RowSink: Sync {
    /// Takes the kernel's elements `t0 .. t0 + values.len()` of row `row`.
    /// `tmp` holds at least `self.temporaries() * values.len()` elements.
    fn store(&self, row: usize, t0: usize, values: &[f32], tmp: &mut [f32]);
    /// Line-sized temporaries `store` needs.
    fn temporaries(&self) -> usize;
    /// Takes elements `t0 .. t0 + len` of rows `row0 .. row0 + rows` (as
    /// [`RowSource::fill_rows`] lays them out), which the kernel no longer
    /// needs: the sink may finish them in place. By default row by row.
    fn store_rows(
        &self,
        row0: usize,
        rows: usize,
        t0: usize,
        len: usize,
        values: &mut [f32],
        tmp: &mut [f32],
    ) {
        for (r, values) in values.chunks_exact(len).take(rows).enumerate() {
            self.store(row0 + r, t0, values, tmp);
        }
    }

    /// Takes element `t` of rows `row0 .. row0 + values.len()` (a column,
    /// as [`RowSource::fill_col`] reads one). By default an element per row.
    fn store_col(&self, row0: usize, t: usize, values: &[f32], tmp: &mut [f32]) {
        for (r, v) in values.iter().enumerate() {
            self.store(row0 + r, t, std::slice::from_ref(v), tmp);
        }
    }

    /// Whether this result is stored better a column at a time than a row
    /// at a time (as [`RowSource::prefers_columns`]).
    fn prefers_columns(&self) -> bool {
        false
    }

    /// Whether [`Self::store_rows`] finishes a block of rows at once, in
    /// place (an identity, or a pointwise epilogue: a conv's activation),
    /// at less cost than row by row. False by default.
    fn finishes_blocks(&self) -> bool {
        false
    }

    /// Whether [`Self::store_rows`] of `rows` rows from `row0`, `len`
    /// elements each, stores across the rows (a line per time step): where
    /// it [prefers columns](Self::prefers_columns), or where the lines
    /// along the rows are too short to pay for their set-up. A kernel that
    /// hands its rows over a few at a time hands over the whole block
    /// instead when this holds.
    fn stores_across(&self, row0: usize, rows: usize, len: usize) -> bool {
        let _ = (row0, rows, len);
        self.prefers_columns()
    }
}

/// Rows [`RowSource::fill_rows`] and [`RowSink::store_rows`] take at most.
/// Long enough that walking a program per line costs little against its
/// arithmetic; short enough that a block's window stays in L2.
pub const ROW_BLOCK: usize = 256;

/// Scratch elements `fill_rows` / `store_rows` need for lines of `len`
/// elements and programs needing `temporaries` temporaries: room for the
/// row-by-row default and for reading across [`ROW_BLOCK`] rows.
pub fn block_tmp(temporaries: usize, len: usize) -> usize {
    (temporaries + 2) * len.max(ROW_BLOCK) + ACROSS_STEPS * ROW_BLOCK
}

/// Time steps `fill_rows` computes across its rows into a tile before
/// transposing the tile into the rows (in whole 8 × 8 blocks).
const ACROSS_STEPS: usize = 16;

/// Whether a program reads its rows better across them: a line along time
/// gathers with a stride, and a line across rows (the dimension before
/// time) with a shorter one (a small part of a cat may be strided either
/// way).
fn prefers_across(stride_along: usize, stride_across: usize) -> bool {
    stride_along > 1 && stride_across < stride_along
}

/// An operand of a fusable kernel: stored, or computed by a prologue.
#[derive(Clone, Copy)]
pub enum RowsIn<'a> {
    /// Stored row-major, as the kernel's plain entry point takes it.
    Slice(&'a [f32]),
    /// Computed row chunk by row chunk.
    Fused(&'a dyn RowSource),
}

/// A result of a fusable kernel: stored as is, or through an epilogue.
pub enum RowsOut<'a> {
    /// Stored row-major, as the kernel's plain entry point writes it.
    Slice(&'a mut [f32]),
    /// Handed over row chunk by row chunk.
    Fused(&'a dyn RowSink),
}

impl RowsIn<'_> {
    /// Line-sized temporaries reading this operand needs.
    pub fn temporaries(&self) -> usize {
        match self {
            RowsIn::Slice(_) => 0,
            RowsIn::Fused(s) => s.temporaries(),
        }
    }
}

/// A [`Program`](super::program::Program) read as rows: the root's last
/// dimension is time and every other dimension enumerates rows (`[B, C,
/// N]`: row `b * C + c`), or, for a per-row scalar (a scan's `x0 [B, C]`),
/// every dimension enumerates rows.
pub struct ProgramRows<'a> {
    program: &'a CompiledProgram,
    /// [`CompiledProgram::temporaries`].
    temporaries: usize,
    env: &'a dyn Env,
    shape: Shape,
    scalar_rows: bool,
    /// Blocks of rows are read across them (see [`prefers_across`]).
    across: bool,
    /// The program's prologue recipes, bound for this call.
    recipes: Prologue<'a>,
}

impl<'a> ProgramRows<'a> {
    /// Rows along the root's last dimension.
    pub fn new(compiled: &'a CompiledProgram, env: &'a dyn Env) -> Self {
        let recipes = compiled.recipes().prologue(compiled, env);
        let program = compiled;
        let shape = env.shape(program.nodes()[program.root()].value);
        let rank = shape.rank();
        let across = rank >= 2
            && compiled.rows_across.get(env.generation(), || {
                let along = program.max_load_stride(env, &Line::along([0; MAX_RANK], rank - 1));
                let over = program.max_load_stride(env, &Line::along([0; MAX_RANK], rank - 2));
                prefers_across(along, over)
            });
        ProgramRows {
            temporaries: compiled.temporaries(),
            program,
            env,
            shape,
            scalar_rows: false,
            across,
            recipes,
        }
    }

    /// One element per row: every dimension of the root enumerates rows.
    pub fn scalar_rows(program: &'a CompiledProgram, env: &'a dyn Env) -> Self {
        ProgramRows {
            scalar_rows: true,
            across: false,
            ..Self::new(program, env)
        }
    }
}

/// `row` spread over the first `dims` dimensions of `shape`.
fn unravel(mut row: usize, shape: &Shape, dims: usize) -> [usize; MAX_RANK] {
    let mut base = [0; MAX_RANK];
    for d in (0..dims).rev() {
        base[d] = row % shape[d];
        row /= shape[d];
    }
    base
}

impl ProgramRows<'_> {
    /// The line across rows `row0 ..` at element `t` (the dimension before
    /// time, or for scalar rows the last one), or `None` for a root with no
    /// such dimension.
    fn col_line(&self, row0: usize, t: usize) -> Option<Line> {
        let rank = self.shape.rank();
        if self.scalar_rows {
            (rank >= 1).then(|| Line::along(unravel(row0, &self.shape, rank), rank - 1))
        } else if rank >= 2 {
            let mut base = unravel(row0, &self.shape, rank - 1);
            base[rank - 1] = t;
            Some(Line::along(base, rank - 2))
        } else {
            None
        }
    }

    /// The line of row `row` from element `t0` (in the root's coordinates).
    fn row_line(&self, row: usize, t0: usize) -> Line {
        let rank = self.shape.rank();
        if self.scalar_rows {
            Line {
                base: unravel(row, &self.shape, rank),
                step: [0; MAX_RANK],
            }
        } else {
            let mut base = unravel(row, &self.shape, rank - 1);
            base[rank - 1] = t0;
            Line::along(base, rank - 1)
        }
    }
}

/// A program with two roots of one shape
/// ([`Program::set_roots`](super::program::Program::set_roots)) read as rows
/// of both.
impl PairSource for ProgramRows<'_> {
    fn fill_pair(
        &self,
        row: usize,
        t0: usize,
        first: &mut [f32],
        second: &mut [f32],
        tmp: &mut [f32],
    ) {
        let line = self.row_line(row, t0);
        if let Some(recipe) = &self.recipes.discretise {
            if recipe.run(&line, first, second) {
                return;
            }
        }
        self.eval_pair(&line, first, second, tmp);
    }

    fn pair_temporaries(&self) -> usize {
        self.program.temporaries()
    }

    fn fill_pair_col(
        &self,
        row0: usize,
        t: usize,
        first: &mut [f32],
        second: &mut [f32],
        tmp: &mut [f32],
    ) {
        match self.col_line(row0, t) {
            Some(line) => self.eval_pair(&line, first, second, tmp),
            None => {
                for (r, (f, s)) in first.iter_mut().zip(second.iter_mut()).enumerate() {
                    self.fill_pair(
                        row0 + r,
                        t,
                        std::slice::from_mut(f),
                        std::slice::from_mut(s),
                        tmp,
                    );
                }
            }
        }
    }
}

impl ProgramRows<'_> {
    /// Both roots of a pair along `line`: flat where the program has a
    /// flat form, else interpreted.
    fn eval_pair(&self, line: &Line, first: &mut [f32], second: &mut [f32], tmp: &mut [f32]) {
        if let Some(flat) = &self.recipes.flat {
            if flat.run_roots(line, &[], 2, &mut [&mut *first, &mut *second], tmp) {
                return;
            }
        }
        self.program
            .eval_roots(self.env, &[], line, &mut [first, second], tmp);
    }

    /// The program along `line` into `out`: by its recipe where one fits
    /// the line, else interpreted.
    pub(super) fn eval_line(&self, line: &Line, out: &mut [f32], tmp: &mut [f32]) {
        if let Some(recipe) = &self.recipes.product {
            if recipe.run(line, out) {
                return;
            }
        }
        if let Some(recipe) = &self.recipes.chain {
            if recipe.run(line, &[], out) {
                return;
            }
        }
        if let Some(flat) = &self.recipes.flat {
            if flat.run(line, &[], out, tmp) {
                return;
            }
        }
        self.program.eval(self.env, &[], line, out, tmp);
    }
}

/// A program's walk of its nodes for one line costs about as much as this
/// many of the line's elements (the arithmetic of a few nodes on
/// contiguous data)...
const LINE_SETUP: usize = 256;
/// ... and an element of a line across rows costs this many more than one
/// along a row: a strided read, and a store into another row.
const ACROSS_EXTRA: usize = 4;

/// Whether `rows` rows of `len` elements cost less as `len` lines across
/// the rows than as `rows` lines along them, by the set-up each line pays
/// ([`LINE_SETUP`], [`ACROSS_EXTRA`]). SileroVAD's prologues (an LSTM
/// cell's gates into a conv of one step, an STFT's magnitude into one of
/// four) walked 129 lines of 1 to 6 elements each per call, and Voxtral's
/// streaming stem (a conv state cat into 8 new frames, GELU after) 128
/// of 10 and 128 of 8.
pub(crate) fn short_rows(rows: usize, len: usize) -> bool {
    short_rows_with(LINE_SETUP, rows, len)
}

/// A flat program's set-up per line ([`super::flat`]: its leaves
/// resolved, no walk of nodes) costs about as much as this many elements.
/// Priced as the interpreter's [`LINE_SETUP`], a FastConformer's GLU filled
/// 16 rows of 12 at a time went across the rows, gathering every operand
/// with a stride, instead of a contiguous flat line per row.
const FLAT_LINE_SETUP: usize = 32;

/// [`short_rows`] for lines whose set-up costs `setup` elements.
fn short_rows_with(setup: usize, rows: usize, len: usize) -> bool {
    setup * rows.saturating_sub(len) > ACROSS_EXTRA * rows * len
}

/// Whether rows `row0 .. row0 + rows` of a `shape` read as rows along its
/// last dimension lie on one line across (one batch item's channels),
/// within what [`block_tmp`] provides for ([`ROW_BLOCK`]).
fn one_line_across(shape: &Shape, row0: usize, rows: usize) -> bool {
    let rank = shape.rank();
    rank >= 2 && rows <= ROW_BLOCK && row0 % shape[rank - 2] + rows <= shape[rank - 2]
}

impl ProgramRows<'_> {
    /// Whether `fill_rows` of `rows` rows from `row0`, `len` elements each,
    /// is better read across the rows: short lines ([`short_rows`]), all
    /// on one line across.
    fn short_lines(&self, row0: usize, rows: usize, len: usize) -> bool {
        let rank = self.shape.rank();
        let flat_rows = rank >= 1
            && self
                .recipes
                .flat
                .as_ref()
                .is_some_and(|f| f.contiguous_along(rank - 1));
        let setup = if flat_rows {
            FLAT_LINE_SETUP
        } else {
            LINE_SETUP
        };
        short_rows_with(setup, rows, len) && one_line_across(&self.shape, row0, rows)
    }
}

impl RowSource for ProgramRows<'_> {
    fn fill(&self, row: usize, t0: usize, out: &mut [f32], tmp: &mut [f32]) {
        self.eval_line(&self.row_line(row, t0), out, tmp);
    }

    fn temporaries(&self) -> usize {
        self.temporaries
    }

    fn isa(&self) -> Isa {
        self.program.isa()
    }

    fn col_rows(&self) -> usize {
        let rank = self.shape.rank();
        match (self.scalar_rows, rank) {
            (true, r) if r >= 1 => self.shape[r - 1],
            (false, r) if r >= 2 => self.shape[r - 2],
            _ => 1,
        }
    }

    fn prefers_columns(&self) -> bool {
        self.across && !self.scalar_rows
    }

    fn whole_rows_one_line(&self, len: usize) -> bool {
        let rank = self.shape.rank();
        !self.scalar_rows
            && rank >= 2
            && len == self.shape[rank - 1]
            && self
                .recipes
                .flat
                .as_ref()
                .is_some_and(|f| f.rows_are_one_line(rank - 2, rank - 1, len))
    }

    fn fill_col(&self, row0: usize, t: usize, out: &mut [f32], tmp: &mut [f32]) {
        match self.col_line(row0, t) {
            Some(line) => self.eval_line(&line, out, tmp),
            None => {
                for (r, o) in out.iter_mut().enumerate() {
                    self.fill(row0 + r, t, std::slice::from_mut(o), tmp);
                }
            }
        }
    }

    fn fill_rows(
        &self,
        row0: usize,
        rows: usize,
        t0: usize,
        len: usize,
        out: &mut [f32],
        tmp: &mut [f32],
    ) {
        let rank = self.shape.rank();
        if let Some(flat) = &self.recipes.flat {
            // Rows of one batch item that lie end to end in every leaf:
            // one line ([`Flat::rows_are_one_line`]).
            let one_item = rank >= 2 && row0 % self.shape[rank - 2] + rows <= self.shape[rank - 2];
            if !self.scalar_rows
                && one_item
                && flat.rows_are_one_line(rank - 2, rank - 1, len)
                && flat.run(&self.row_line(row0, t0), &[], &mut out[..rows * len], tmp)
            {
                return;
            }
        }
        if !(self.across || self.short_lines(row0, rows, len)) || self.scalar_rows {
            for (r, out) in out.chunks_exact_mut(len).take(rows).enumerate() {
                self.fill(r + row0, t0, out, tmp);
            }
            return;
        }
        let mut base = unravel(row0, &self.shape, rank - 1);
        if let Some(Gather { data, offset, coef }) = self.recipes.gather {
            // A transposing copy: per time step, the rows' elements (close
            // together in the stored tensor) into their rows.
            base[rank - 1] = t0;
            let start = offset + (0..rank).map(|d| base[d] * coef[d]).sum::<usize>();
            let (across, along) = (coef[rank - 2], coef[rank - 1]);
            if across == 1 && rows > 0 && len > 0 {
                // The rows' elements of a time step are a contiguous run.
                let span = (len - 1) * along + rows;
                let isa = self.program.isa();
                strided::transpose(isa, &data[start..start + span], along, len, rows, out, len);
                return;
            }
            for t in 0..len {
                let first = start + t * along;
                for (r, v) in out.chunks_exact_mut(len).take(rows).enumerate() {
                    v[t] = data[first + r * across];
                }
            }
            return;
        }
        // One line across the rows per time step, a tile of steps at a
        // time, then the tile transposed into the rows: a LayerNorm of a
        // `[B, N, C]` residual sum before a FastConformer's pointwise conv
        // (128 channels, 32 frames) had scattered its values one by one.
        let steps = (ACROSS_STEPS * ROW_BLOCK / rows.max(1)).clamp(1, ACROSS_STEPS);
        let (tile, tmp) = tmp.split_at_mut(steps * rows);
        for s0 in (0..len).step_by(steps) {
            let n = steps.min(len - s0);
            for (s, line) in tile.chunks_exact_mut(rows).take(n).enumerate() {
                base[rank - 1] = t0 + s0 + s;
                self.eval_line(&Line::along(base, rank - 2), line, tmp);
            }
            strided::transpose(self.program.isa(), tile, rows, n, rows, &mut out[s0..], len);
        }
    }
}

/// A view between an epilogue's elementwise result and the stored result
/// (a permute, squeeze or unsqueeze): the view's dimension `d` is its
/// input's dimension `map[d]`, or an inserted size-1 one (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreView {
    #[allow(missing_docs)]
    pub map: [Option<u8>; MAX_RANK],
    /// The view's rank.
    pub rank: usize,
}

impl StoreView {
    /// The line in the view's coordinates for a line in its input's.
    fn forward(&self, line: &Line) -> Line {
        let mut to = Line::default();
        for d in 0..self.rank {
            if let Some(f) = self.map[d] {
                to.base[d] = line.base[f as usize];
                to.step[d] = line.step[f as usize];
            }
        }
        to
    }
}

/// A row-major f32 tensor that tasks on several threads write disjoint
/// elements of.
pub struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: `SharedOut` only writes through `store_line` and `with_line`,
// whose callers write each element from exactly one task: the epilogue
// sinks (the store views are bijections from the anchor's output to the
// stored value, and kernels hand every output element to the sink once),
// `materialise_across` (each task owns a block of rows over a tile of time
// steps) and the reductions (`reduce.rs`: each task owns whole outputs or a
// block of them, disjoint from every other task's) and the chunked scan
// (`scan/mod.rs`: each task owns one piece of one row).
unsafe impl Sync for SharedOut<'_> {}
unsafe impl Send for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    /// Borrows `data` for the duration of a kernel call.
    pub fn new(data: &'a mut [f32]) -> Self {
        SharedOut {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: PhantomData,
        }
    }

    #[cfg(test)]
    pub(crate) fn store_line_for_test(&self, start: usize, stride: usize, values: &[f32]) {
        self.store_line(start, stride, values)
    }

    /// Calls `f` with elements `start .. start + len` to write (`f` may
    /// leave them unwritten) and returns what it returns.
    ///
    /// # Panics
    /// If the run leaves the tensor.
    pub(crate) fn with_line<R>(
        &self,
        start: usize,
        len: usize,
        f: impl FnOnce(&mut [f32]) -> R,
    ) -> R {
        assert!(
            start + len <= self.len,
            "store past the end ({} of {})",
            start + len,
            self.len
        );
        // SAFETY: in bounds (checked above); no other task writes these
        // elements (see the Sync impl) and nothing reads them during the
        // kernel call (which holds the `&mut` borrow), so this exclusive
        // slice aliases nothing while `f` holds it, and it cannot outlive
        // `f`.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) };
        f(dst)
    }

    /// Writes `rows` lines of `len` elements transposed, with the vectors
    /// of `isa`: `values[r * len + t]` at offset `start + t * stride + r`
    /// (a block of a `[C, N]` result stored as `[N, C]`).
    ///
    /// # Panics
    /// If an element leaves the tensor or `values` is short (checked
    /// before any write).
    pub(super) fn store_transposed(
        &self,
        isa: Isa,
        start: usize,
        stride: usize,
        rows: usize,
        len: usize,
        values: &[f32],
    ) {
        if rows == 0 || len == 0 {
            return;
        }
        let last = start + (len - 1) * stride + rows - 1;
        assert!(
            last < self.len && values.len() >= rows * len,
            "store past the end ({last} of {})",
            self.len
        );
        // SAFETY: every element read is `values[r * len + t]`, `r < rows`,
        // `t < len`, inside `values` (asserted); every element written is
        // at most `last`, in bounds (asserted); no other task writes them
        // (see the Sync impl), nothing reads them during the kernel call
        // (which holds the `&mut` borrow), and `values` is a separate
        // buffer.
        unsafe {
            strided::transpose_raw(
                isa,
                values.as_ptr(),
                len,
                rows,
                len,
                self.ptr.add(start),
                stride,
            )
        }
    }

    /// Writes `values[t]` at offset `start + t * stride`.
    ///
    /// # Panics
    /// If the line leaves the tensor (checked before any write).
    pub(super) fn store_line(&self, start: usize, stride: usize, values: &[f32]) {
        let Some(n) = values.len().checked_sub(1) else {
            return;
        };
        let last = start + stride * n;
        assert!(
            last < self.len,
            "store past the end ({last} of {})",
            self.len
        );
        if stride == 1 {
            // The common case (a result stored as the kernel walks it): one
            // vectorised copy instead of a strided loop (vector moves, not
            // `memcpy`: see `ops::copy`).
            // SAFETY: `start .. start + values.len()` is in bounds (checked
            // above, `last` is its end); no other task writes these elements
            // (see the Sync impl), nothing reads them during the kernel call
            // (which holds the `&mut` borrow), so this exclusive slice
            // aliases nothing while it lives, and `values` is a separate
            // buffer.
            let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), values.len()) };
            copy(dst, values);
            return;
        }
        for (t, &v) in values.iter().enumerate() {
            // SAFETY: in bounds (checked above); no other task writes this
            // element (see the Sync impl) and nothing reads it during the
            // kernel call, which holds the `&mut` borrow.
            unsafe { self.ptr.add(start + t * stride).write(v) };
        }
    }
}

/// An epilogue: the program's root (over the anchor's output coordinates,
/// reading the anchor's chunk as [`crate::fused::Expr::Anchor`]) stored
/// through `views` into `out` of shape `out_shape`.
pub struct EpilogueSink<'a> {
    program: &'a CompiledProgram,
    /// [`CompiledProgram::temporaries`].
    temporaries: usize,
    env: &'a dyn Env,
    /// Shape of the anchor's output (rows over all but its last dimension).
    anchor_shape: Shape,
    views: &'a [StoreView],
    out: SharedOut<'a>,
    out_shape: Shape,
    /// Blocks of rows are finished and stored across them.
    across: bool,
    /// The one-pass loop for an epilogue of a recipe's form.
    recipe: Option<EpilogueRecipe<'a>>,
    /// The result is larger than the caches: store it with non-temporal
    /// stores.
    stream: bool,
    /// The epilogue is the anchor's values as they are (only the store
    /// views act: a conv's `[B, C, N]` result permuted into `[B, N, C]`).
    identity: bool,
}

// Results at least this large (bytes) an epilogue recipe stores with
// non-temporal stores (a fifth of the SSM block's traffic saved): the
// threshold the scan measured, defined once beside the non-temporal copy.
use super::ops::STREAM_OUTPUT_BYTES;

impl<'a> EpilogueSink<'a> {
    #[allow(missing_docs)]
    pub fn new(
        program: &'a CompiledProgram,
        env: &'a dyn Env,
        anchor_shape: Shape,
        views: &'a [StoreView],
        out: &'a mut [f32],
        out_shape: Shape,
    ) -> Self {
        let recipes = program.recipes();
        let mut sink = EpilogueSink {
            program,
            temporaries: program.temporaries(),
            env,
            anchor_shape,
            views,
            out: SharedOut::new(out),
            out_shape,
            across: false,
            recipe: recipes.epilogue(program, env),
            stream: false,
            identity: recipes.identity(),
        };
        sink.stream = std::mem::size_of::<f32>() * sink.out.len >= STREAM_OUTPUT_BYTES;
        let rank = anchor_shape.rank();
        if rank >= 2 {
            sink.across = program.sink_across.get(env.generation(), || {
                let stride = |dim: usize| {
                    let line = Line::along([0; MAX_RANK], dim);
                    sink.store_at(&line)
                        .1
                        .max(program.max_load_stride(env, &line))
                };
                prefers_across(stride(rank - 1), stride(rank - 2))
            });
        }
        sink
    }

    /// Start and stride in the stored result of a line in the anchor's
    /// coordinates.
    fn store_at(&self, line: &Line) -> (usize, usize) {
        let mut to = *line;
        for view in self.views {
            to = view.forward(&to);
        }
        let strides = self.out_shape.strides();
        let r = self.out_shape.rank();
        let start = (0..r).map(|d| to.base[d] * strides[d]).sum();
        let stride = (0..r).map(|d| to.step[d] * strides[d]).sum();
        (start, stride)
    }
}

impl EpilogueSink<'_> {
    /// The line of the anchor's row `row` from element `t0`.
    fn row_line(&self, row: usize, t0: usize) -> Line {
        let rank = self.anchor_shape.rank();
        let mut base = unravel(row, &self.anchor_shape, rank - 1);
        base[rank - 1] = t0;
        Line::along(base, rank - 1)
    }

    /// Finished values stored from `start`, `stride` apart.
    fn store_finished(&self, start: usize, stride: usize, values: &[f32]) {
        if self.stream && stride == 1 {
            self.out
                .with_line(start, values.len(), |out| copy_streaming(out, values));
        } else {
            self.out.store_line(start, stride, values);
        }
    }

    /// The epilogue of the anchor's `values` along `line` into `buf`: by
    /// `recipe` where it fits the line, else interpreted (`tmp` holds the
    /// interpreter's temporaries).
    fn finish_line(
        &self,
        recipe: Option<&EpilogueRecipe>,
        line: &Line,
        values: &[f32],
        buf: &mut [f32],
        tmp: &mut [f32],
    ) {
        if !recipe.is_some_and(|r| r.run(line, values, buf, tmp)) {
            self.program.eval(self.env, values, line, buf, tmp);
        }
    }
}

impl RowSink for EpilogueSink<'_> {
    fn store(&self, row: usize, t0: usize, values: &[f32], tmp: &mut [f32]) {
        let line = self.row_line(row, t0);
        let (start, stride) = self.store_at(&line);
        let len = values.len();
        if self.identity {
            // Nothing to finish: stored as they are.
            self.store_finished(start, stride, values);
            return;
        }
        let mut recipe = self.recipe.as_ref();
        if let (Some(r), 1) = (recipe, stride) {
            let done = if self.stream {
                // Finished in L1, then streamed past the caches.
                let (buf, tmp) = tmp.split_at_mut(len);
                let fits = r.run(&line, values, buf, tmp);
                if fits {
                    self.out
                        .with_line(start, len, |out| copy_streaming(out, buf));
                }
                fits
            } else {
                // Finished straight into the result: no buffer, no copy.
                self.out
                    .with_line(start, len, |out| r.run(&line, values, out, tmp))
            };
            if done {
                return;
            }
            // The recipe does not fit this line.
            recipe = None;
        }
        let (buf, rest) = tmp.split_at_mut(len);
        self.finish_line(recipe, &line, values, buf, rest);
        self.out.store_line(start, stride, buf);
    }

    fn temporaries(&self) -> usize {
        1 + self.temporaries
    }

    fn prefers_columns(&self) -> bool {
        self.across
    }

    fn finishes_blocks(&self) -> bool {
        !self.across && (self.identity || self.recipe.as_ref().is_some_and(|r| r.pointwise()))
    }

    fn stores_across(&self, row0: usize, rows: usize, len: usize) -> bool {
        // An identity epilogue walks no program: its rows are stored as
        // they are, whatever their length.
        self.across
            || (!self.identity
                && short_rows(rows, len)
                && one_line_across(&self.anchor_shape, row0, rows))
    }

    fn store_col(&self, row0: usize, t: usize, values: &[f32], tmp: &mut [f32]) {
        let rank = self.anchor_shape.rank();
        if rank < 2 {
            for (r, v) in values.iter().enumerate() {
                self.store(row0 + r, t, std::slice::from_ref(v), tmp);
            }
            return;
        }
        let mut base = unravel(row0, &self.anchor_shape, rank - 1);
        base[rank - 1] = t;
        let line = Line::along(base, rank - 2);
        let (buf, rest) = tmp.split_at_mut(values.len());
        self.finish_line(self.recipe.as_ref(), &line, values, buf, rest);
        let (start, stride) = self.store_at(&line);
        self.out.store_line(start, stride, buf);
    }

    fn store_rows(
        &self,
        row0: usize,
        rows: usize,
        t0: usize,
        len: usize,
        values: &mut [f32],
        tmp: &mut [f32],
    ) {
        if !self.stores_across(row0, rows, len) {
            // A pointwise epilogue (a conv's activation) finishes the block
            // in place, a few long loops rather than a short line per row
            // (a GELU over 64 outputs is 4 dependent vector chains, bound
            // by their latency); then the rows are stored as they are.
            let pointwise = !self.identity
                && self
                    .recipe
                    .as_ref()
                    .is_some_and(|r| r.finish_in_place(&mut values[..rows * len], tmp));
            for (r, values) in values.chunks_exact(len).take(rows).enumerate() {
                if pointwise {
                    let (start, stride) = self.store_at(&self.row_line(row0 + r, t0));
                    self.store_finished(start, stride, values);
                } else {
                    self.store(row0 + r, t0, values, tmp);
                }
            }
            return;
        }
        // Per time step: the rows' values gathered into one line across
        // them, finished, and stored (contiguously, in a transposed result).
        let rank = self.anchor_shape.rank();
        let mut base = unravel(row0, &self.anchor_shape, rank - 1);
        base[rank - 1] = t0;
        // The views are affine: a step in time moves the stored column by
        // a fixed offset.
        let (start, stride) = self.store_at(&Line::along(base, rank - 2));
        base[rank - 1] = t0 + 1;
        let step = self.store_at(&Line::along(base, rank - 2)).0 - start;
        // A pointwise epilogue (a conv's activation) finishes the whole
        // block in place, a few long loops instead of one short line per
        // time step; then only the store views act, as for an identity.
        let finished = self.identity
            || self
                .recipe
                .as_ref()
                .is_some_and(|r| r.finish_in_place(&mut values[..rows * len], tmp));
        if finished && stride == 1 {
            // Each column is a contiguous run of the result (a `[C, N]`
            // result stored as `[N, C]`): the block is stored transposed,
            // a vector at a time.
            let isa = self.program.isa();
            self.out
                .store_transposed(isa, start, step, rows, len, values);
            return;
        }
        if finished && step == 1 {
            // Each row is a contiguous run of the result (`stride` apart):
            // stored as they are, not a column (a strided store) per step.
            for (r, values) in values.chunks_exact(len).take(rows).enumerate() {
                self.store_finished(start + r * stride, 1, values);
            }
            return;
        }
        let (anchor, tmp) = tmp.split_at_mut(rows);
        let (buf, tmp) = tmp.split_at_mut(rows);
        for t in 0..len {
            for (r, a) in anchor.iter_mut().enumerate() {
                *a = values[r * len + t];
            }
            let start = start + t * step;
            if finished {
                // Nothing (left) to finish: the column is stored as it is.
                self.out.store_line(start, stride, anchor);
                continue;
            }
            base[rank - 1] = t0 + t;
            let line = Line::along(base, rank - 2);
            self.finish_line(self.recipe.as_ref(), &line, anchor, buf, tmp);
            self.out.store_line(start, stride, buf);
        }
    }
}

/// Elements per line chunk of [`materialise`] and [`drain`].
pub const LINE_CHUNK: usize = 1024;

// Fewest elements per task of [`materialise`] and [`drain`].
use crate::par::MIN_TASK_ELEMS;

/// Time steps of [`LINE_CHUNK`] rows each that [`materialise`] holds
/// before it writes short rows from them: every step of a decode step's
/// state up to K = 5 (rows of `K - 1` <= 4), so such rows come in chunks
/// of [`LINE_CHUNK`]. Chunks of `LINE_CHUNK / (K - 1)` rows cost a program
/// walk per step and chunk more: 10% of a 4096-channel conv step (K = 4)
/// on an AVX-512 Xeon.
const SHORT_COLS: usize = 4;

/// f32 elements of per-thread scratch [`materialise`] or [`drain`] needs
/// for a source or sink needing `temporaries` line-sized temporaries (and
/// the time steps of short rows, or a tile, for transposed ones).
pub fn line_scratch(temporaries: usize) -> usize {
    ((temporaries + SHORT_COLS) * LINE_CHUNK)
        .max(ROW_BLOCK * ACROSS_TILE + col_tmp(temporaries, ROW_BLOCK))
}

/// Stores `source`'s rows (`row_len` elements each) into `out`, in
/// parallel on the current pool: one pass over memory for a whole fused
/// elementwise program.
pub fn materialise(
    source: &dyn RowSource,
    out: &mut [f32],
    row_len: usize,
    scratch: &crate::scratch::Scratch,
) {
    if out.is_empty() || row_len == 0 {
        return;
    }
    let run = source.col_rows();
    let rows = out.len() / row_len;
    if row_len <= SHORT_ROW
        && run > 1
        && rows.is_multiple_of(run)
        && source.whole_rows_one_line(row_len)
    {
        materialise_whole_rows(source, out, row_len, run, scratch);
        return;
    }
    // Short rows (a decode step's state update: `K - 1` elements per
    // channel) are computed a column at a time.
    if run > 1
        && short_rows(run.min(LINE_CHUNK), row_len)
        && (out.len() / row_len).is_multiple_of(run)
    {
        // Lines across the rows (one program walk per time step and up to
        // LINE_CHUNK rows, not per row): every time step's line first,
        // then the rows written whole from them.
        let isa = source.isa();
        let chunk = LINE_CHUNK.min(SHORT_COLS * LINE_CHUNK / row_len);
        let item = |(i, out): (usize, &mut [f32])| {
            scratch.with_slot(|slot| {
                let (cols, tmp) = slot.split_at_mut(SHORT_COLS * LINE_CHUNK);
                for c0 in (0..run).step_by(chunk) {
                    let n = chunk.min(run - c0);
                    let cols = &mut cols[..n * row_len];
                    for (t, col) in cols.chunks_exact_mut(n).enumerate() {
                        source.fill_col(i * run + c0, t, col, tmp);
                    }
                    strided::interleave_by(isa, row_len, cols, &mut out[c0 * row_len..]);
                }
            })
        };
        if out.len() <= MIN_TASK_ELEMS {
            out.chunks_mut(run * row_len).enumerate().for_each(item);
        } else {
            crate::par::for_each_chunk_mut(out, run * row_len, |i, out| item((i, out)));
        }
        return;
    }
    if source.prefers_columns() && run > 1 && rows.is_multiple_of(run) {
        materialise_across(source, out, row_len, run, scratch);
        return;
    }
    let min_rows = MIN_TASK_ELEMS.div_ceil(row_len);
    crate::par::for_each_chunk_mut_min(out, row_len, min_rows, |row, out| {
        scratch.with_slot(|tmp| {
            for (i, chunk) in out.chunks_mut(LINE_CHUNK).enumerate() {
                source.fill(row, i * LINE_CHUNK, chunk, tmp);
            }
        })
    });
}

/// Rows at most this long are materialised or drained in blocks of rows
/// when their program allows ([`materialise_whole_rows`], [`drain`]); the
/// scratch [`line_scratch`] sizes holds such a block's temporaries
/// ([`block_tmp`]).
const SHORT_ROW: usize = ROW_BLOCK;

/// [`materialise`] of whole rows that lie end to end in every operand (a
/// GLU staged before a conv of a few frames): per task, a block of rows of
/// one batch item, one line ([`RowSource::fill_rows`]). Row by row, a
/// FastConformer's GLU before a depthwise conv of 16 frames was 128 lines
/// of 16 elements, each paying a line's set-up.
fn materialise_whole_rows(
    source: &dyn RowSource,
    out: &mut [f32],
    row_len: usize,
    run: usize,
    scratch: &crate::scratch::Scratch,
) {
    let block = run.min(MIN_TASK_ELEMS.div_ceil(row_len)).max(1);
    let blocks = run.div_ceil(block);
    let items = out.len() / row_len / run;
    let out = SharedOut::new(out);
    crate::par::for_each(items * blocks, |task| {
        let (item, b) = (task / blocks, task % blocks);
        let row0 = item * run + b * block;
        let rows = block.min(run - b * block);
        scratch.with_slot(|tmp| {
            out.with_line(row0 * row_len, rows * row_len, |dst| {
                source.fill_rows(row0, rows, 0, row_len, dst, tmp)
            })
        })
    });
}

/// Time steps of one task of [`materialise_across`]: a tile of
/// [`ROW_BLOCK`] rows by this many steps (32 KiB) stays in L1, and each of
/// its rows is stored as two whole cache lines.
const ACROSS_TILE: usize = 32;

/// [`materialise`] of a source whose rows lie far apart in memory and whose
/// columns close together (a transposed `[B, N, C]` tensor, a norm over its
/// channels applied on the way): per task, blocks of up to [`ROW_BLOCK`]
/// rows of one batch item over [`ACROSS_TILE`] time steps, a line across
/// the rows per step (a contiguous run of the stored tensor) into a tile,
/// then the tile's rows stored as contiguous runs. Row by row, every
/// element read is a gather with the stored tensor's row stride; column by
/// column, every element stored is a scatter with the output's, each on
/// another page: both took 17-24 ms for wav2vec2's second conv's input
/// (`[1, 512, 3199]`, 1 thread), this takes 2.
fn materialise_across(
    source: &dyn RowSource,
    out: &mut [f32],
    row_len: usize,
    run: usize,
    scratch: &crate::scratch::Scratch,
) {
    let blocks = run.div_ceil(ROW_BLOCK);
    let tiles = row_len.div_ceil(ACROSS_TILE);
    let items = out.len() / row_len / run;
    let out = SharedOut::new(out);
    let min_tasks = MIN_TASK_ELEMS.div_ceil(ROW_BLOCK * ACROSS_TILE);
    crate::par::for_each_min(items * blocks * tiles, min_tasks, |task| {
        let (item, rest) = (task / (blocks * tiles), task % (blocks * tiles));
        let (block, tile) = (rest / tiles, rest % tiles);
        let row0 = item * run + block * ROW_BLOCK;
        let rows = ROW_BLOCK.min(run - block * ROW_BLOCK);
        let t0 = tile * ACROSS_TILE;
        let steps = ACROSS_TILE.min(row_len - t0);
        scratch.with_slot(|slot| {
            let (buf, tmp) = slot.split_at_mut(ROW_BLOCK * ACROSS_TILE);
            let buf = &mut buf[..rows * steps];
            for (i, line) in buf.chunks_exact_mut(rows).enumerate() {
                source.fill_col(row0, t0 + i, line, tmp);
            }
            for r in 0..rows {
                out.with_line((row0 + r) * row_len + t0, steps, |dst| {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = buf[i * rows + r];
                    }
                });
            }
        })
    });
}

/// Elements of a block [`drain`] copies into scratch for a sink that
/// finishes blocks: with [`block_tmp`] of rows up to [`SHORT_ROW`] long,
/// within what [`line_scratch`] sizes.
const DRAIN_BLOCK: usize = 2048;

/// Hands stored rows of a kernel's output (`row_len` elements each) to
/// `sink`: the epilogue of a kernel that cannot run it in its own loops.
pub fn drain(
    sink: &dyn RowSink,
    values: &[f32],
    row_len: usize,
    scratch: &crate::scratch::Scratch,
) {
    if values.is_empty() || row_len == 0 {
        return;
    }
    let rows = values.len().div_ceil(row_len);
    if row_len <= SHORT_ROW && sink.finishes_blocks() && values.len().is_multiple_of(row_len) {
        // Blocks of rows finished at once: a copy in scratch, which the
        // sink finishes in place ([`RowSink::store_rows`]).
        let block = (DRAIN_BLOCK / row_len).max(1);
        crate::par::for_each_min(
            rows.div_ceil(block),
            MIN_TASK_ELEMS.div_ceil(DRAIN_BLOCK),
            |b| {
                let (row0, n) = (b * block, block.min(rows - b * block));
                scratch.with_slot(|slot| {
                    let (buf, tmp) = slot.split_at_mut(n * row_len);
                    buf.copy_from_slice(&values[row0 * row_len..][..n * row_len]);
                    sink.store_rows(row0, n, 0, row_len, buf, tmp);
                })
            },
        );
        return;
    }
    crate::par::for_each_min(rows, MIN_TASK_ELEMS.div_ceil(row_len), |row| {
        let values = &values[row * row_len..values.len().min((row + 1) * row_len)];
        scratch.with_slot(|tmp| {
            for (i, chunk) in values.chunks(LINE_CHUNK).enumerate() {
                sink.store(row, i * LINE_CHUNK, chunk, tmp);
            }
        })
    });
}
